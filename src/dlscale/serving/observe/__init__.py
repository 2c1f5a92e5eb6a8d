"""Observation: statistics, Prometheus metrics and exposition, traces and logs."""
