"""Runtimes that compute a model: one module per runtime, chosen by the config's `backend`."""

from __future__ import annotations

from pathlib import Path

from dlscale.backends.base import Backend, BackendOptions, Capabilities
from dlscale.errors import ConfigError

#: Backend name in config.toml -> the file name its model is stored under in a version folder.
MODEL_FILES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("model.onnx",),
    "torch": ("model.aoti.pt2", "model.pt2", "model.pt", "model.zoo"),
    # No model: the tensors come from config.toml; an empty marker keeps version folders alike.
    "null": ("model.null",),
    # User code: dlscale's `Model` class or Triton's `TritonPythonModel` (docs/backends.md).
    "python": ("model.py",),
}


def create_backend(kind: str, path: Path, options: BackendOptions) -> Backend:
    """A backend of the named kind for the model file at `path`, not yet loaded.

    Runtimes are imported here, lazily, so that a machine without one runtime still serves
    models of the others.
    """
    if kind == "onnxruntime":
        from dlscale.backends.onnxruntime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(path, options)
    if kind == "torch":
        try:
            from dlscale.backends.torch import TorchBackend
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            raise ConfigError(
                f"backend 'torch' needs PyTorch, which is not installed ({exc}); "
                "pip install 'dlscale[torch]'"
            ) from None
        return TorchBackend(path, options)
    if kind == "null":
        from dlscale.backends.null import NullBackend

        return NullBackend(path, options)
    if kind == "python":
        from dlscale.backends.python import PythonBackend

        return PythonBackend(path, options)
    raise ConfigError(f"unknown backend {kind!r}: expected one of {sorted(MODEL_FILES)}")


__all__ = ["MODEL_FILES", "Backend", "BackendOptions", "Capabilities", "create_backend"]
