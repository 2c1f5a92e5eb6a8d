"""Recording: statistics, token measures, traces and logs (read by the metrics room above)."""
