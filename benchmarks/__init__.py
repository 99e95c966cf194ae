"""Benchmarks (`make bench`). Ratios are measured side by side in one run: the machine is shared."""
