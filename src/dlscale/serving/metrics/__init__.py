"""Exposition: the Prometheus collectors that read the served models, and the metrics port."""
