"""Runtimes that compute a model: one module per runtime, chosen by the config's `backend`."""

from __future__ import annotations

import importlib
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
    # Built-in processing steps (docs/processing.md): no model file, their settings are the
    # config's [backend_options]; the marker keeps version folders alike. The tokenizer reads
    # the `tokenizers` file its folder holds.
    "image": ("model.image",),
    "tokenizer": ("tokenizer.json",),
    "topk": ("model.topk",),
    # Generative engines (docs/generative.md) load a Hugging Face folder: the version folder
    # holds config.json, the weights and the tokenizer.
    "transformers": ("config.json",),
    # A Triton vLLM-backend model keeps vLLM's engine arguments in model.json instead.
    "vllm": ("config.json", "model.json"),
}


#: Backend name -> (module, class, the extra that installs its runtime or "" when the core has it).
_RUNTIMES: dict[str, tuple[str, str, str]] = {
    "onnxruntime": ("dlscale.backends.onnxruntime", "OnnxRuntimeBackend", ""),
    "torch": ("dlscale.backends.torch", "TorchBackend", "torch"),
    "null": ("dlscale.backends.null", "NullBackend", ""),
    "python": ("dlscale.backends.python", "PythonBackend", ""),
    "image": ("dlscale.backends.processing.image", "ImageBackend", ""),
    "tokenizer": ("dlscale.backends.processing.tokenizer", "TokenizerBackend", ""),
    "topk": ("dlscale.backends.processing.topk", "TopKBackend", ""),
    "transformers": ("dlscale.backends.generative.transformers", "TransformersBackend", "llm"),
    "vllm": ("dlscale.backends.generative.vllm", "VllmBackend", "vllm"),
}


def create_backend(kind: str, path: Path, options: BackendOptions) -> Backend:
    """A backend of the named kind for the model file at `path`, not yet loaded.

    Runtimes are imported here, lazily, so that a machine without one runtime (an optional
    extra) still serves models of the others; a missing runtime is a ConfigError naming the
    extra that installs it.
    """
    if kind not in _RUNTIMES:
        raise ConfigError(f"unknown backend {kind!r}: expected one of {sorted(MODEL_FILES)}")
    module_name, class_name, extra = _RUNTIMES[kind]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not extra or (exc.name or "").startswith("dlscale"):
            raise
        raise ConfigError(
            f"backend {kind!r} needs {exc.name}, which is not installed; "
            f"pip install 'dlscale[{extra}]'"
        ) from None
    backend: Backend = getattr(module, class_name)(path, options)
    return backend


__all__ = ["MODEL_FILES", "Backend", "BackendOptions", "Capabilities", "create_backend"]
