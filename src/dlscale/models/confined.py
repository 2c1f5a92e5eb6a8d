"""Reading a file a model's config names: the rule lives in backends/confined.py, below both the
model configs (here) and the runtimes that read files of their version folders."""

from __future__ import annotations

from dlscale.backends.confined import read_confined

__all__ = ["read_confined"]
