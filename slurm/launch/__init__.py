"""What runs on the login node: from an experiment to a submitted job, and `deepdive eval`."""
