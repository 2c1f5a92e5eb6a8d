"""Benchmarks run by `make bench` (`python -m benchmarks.run`); results go to BENCHMARKS.md."""
