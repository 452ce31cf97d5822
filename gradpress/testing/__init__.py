"""Helpers for the project's own tests and benchmarks (not used by training jobs)."""
