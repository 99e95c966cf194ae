"""Tests of the slurm package."""
