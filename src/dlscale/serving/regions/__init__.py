"""Shared-memory regions (system and CUDA): registered by clients, leased by requests."""
