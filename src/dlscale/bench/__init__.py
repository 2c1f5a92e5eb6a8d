"""Benchmarks with the MLPerf LoadGen: in-process models and any Open Inference Protocol server."""
