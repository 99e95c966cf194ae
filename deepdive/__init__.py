"""The RL side of deepdive-slurm: data conversion, prompts and tools, the multi-turn rollout."""
