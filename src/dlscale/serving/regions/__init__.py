"""Shared-memory regions (system and CUDA): registered by clients, leased by requests."""

# Here, not in registry.py: `dlscale serve`'s settings read it without importing numpy.

#: The most regions registered at once, unless told otherwise (`--max-shm-regions`).
MAX_REGIONS = 256
