"""The launcher: the `deepdive` command line; later, Slurm submission and node bootstrap."""
