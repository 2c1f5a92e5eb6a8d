"""Recording: statistics, token measures, traces and logs (read by the metrics room above)."""

# Defaults that `dlscale serve`'s settings share with the modules here live in this light module,
# so that `dlscale -h` reads them without importing numpy.

#: One in this many requests is traced, unless told otherwise (`--trace-rate`, `trace_rate`).
TRACE_RATE = 1000
