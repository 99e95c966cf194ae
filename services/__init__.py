"""The HTTP services of deepdive-slurm: the tool server and the reward server, and the pieces they share."""
