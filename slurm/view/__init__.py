"""What reads a run's folder for a person: `deepdive status` and `deepdive trajectories`."""
