"""Hardware: the accelerator catalog, device detection (NVML, MIG, CPU), telemetry, the roofline."""
