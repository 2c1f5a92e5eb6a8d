"""Serving core: model lifecycle, dynamic batching, instances, the DataPlane and metrics."""
