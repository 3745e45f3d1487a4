"""Benchmarks of the disco runtime, run from the repository root as ``python -m bench.NAME`` (see README.md)."""
