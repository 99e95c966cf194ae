"""Tests of the deepdive package."""
