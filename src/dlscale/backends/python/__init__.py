"""User Python models: dlscale's `Model` API and Triton's `TritonPythonModel`, in process or not."""

from __future__ import annotations

from dlscale.backends.python.backend import PythonBackend

__all__ = ["PythonBackend"]
