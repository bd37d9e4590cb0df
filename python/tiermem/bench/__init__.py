"""Benchmarks run by ``tiermem bench``: tiermem and its baselines side by side in one run."""
