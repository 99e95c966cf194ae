"""The CPU backend of `deepdive run`: a tiny policy, its SGLang-compatible engine, the warm
start, the GRPO trainer, checkpoints and the run that ties them to the real services."""
