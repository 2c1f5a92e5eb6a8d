"""Runtimes that compute a model: one module per runtime, chosen by the config's `backend`.

`RUNTIMES` is the one table of backends: every other list of backend names (the model files a
repository looks for, Triton's platform names, what a load request may upload) derives from it.
"""

from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass
from pathlib import Path

from dlscale.backends.base import Backend, BackendOptions, Capabilities
from dlscale.errors import ConfigError

#: What a Hugging Face folder holds besides code: its settings, weights and tokenizer, all data
#: (`*.safetensors` is a tensor table; pickled `*.bin`/`*.pt` weights and `*.py` files are not).
_HF_DATA = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "chat_template.jinja",
    "vocab.json",
    "*.txt",
    "tokenizer.model",
    "*.safetensors",
    "model.safetensors.index.json",
)


@dataclass(frozen=True)
class Runtime:
    """One backend: the class that runs it, the files it reads, how Triton names it."""

    #: Module and class of the Backend; imported only when a model of this kind loads.
    module: str
    cls: str
    #: The files a version folder holds for it, in preference order.
    model_files: tuple[str, ...]
    #: Triton's platform name, reported when config.toml names none.
    platform: str
    #: The extra that installs its runtime, or "" when the core has it.
    extra: str = ""
    #: Other names of it in Triton's config.pbtxt (`platform` or `backend`).
    triton_names: tuple[str, ...] = ()
    #: Names (glob patterns) of the files a load request may upload for it: data whose loading
    #: runs no code the client chose (docs/limits.md). Empty: it takes no uploaded files.
    uploads: tuple[str, ...] = ()
    #: "module:function" that checks an uploaded file's bytes, `(file_name, data) -> None`,
    #: raising PermissionDenied for one whose loading would reach past its data (imported only
    #: when such a file is uploaded); "" when its names say enough.
    upload_check: str = ""


RUNTIMES: dict[str, Runtime] = {
    "onnxruntime": Runtime(
        "dlscale.backends.onnxruntime",
        "OnnxRuntimeBackend",
        ("model.onnx",),
        "onnxruntime_onnx",
        triton_names=("onnxruntime_onnx", "onnxruntime"),
        # A graph and the raw tensors of its external data (their paths checked at upload);
        # custom-op libraries are never loaded from a model's folder.
        uploads=("*.onnx", "*.data", "*.bin", "*.weight", "*.weights", "*.txt"),
    ),
    # model.aoti.pt2 is a shared library, model.pt2 and model.pt unpickle and run TorchScript:
    # code, so they come from the repository only. model.zoo names one of the zoo's own
    # factories (files.py) with its arguments.
    "torch": Runtime(
        "dlscale.backends.torch",
        "TorchBackend",
        ("model.aoti.pt2", "model.pt2", "model.pt", "model.zoo"),
        "pytorch_libtorch",
        extra="torch",
        triton_names=("pytorch_libtorch", "pytorch"),
        uploads=("*.zoo", "*.txt"),
    ),
    # A SavedModel folder (Triton's name for it) or a Keras 3 file. Uploads: the SavedModel's
    # graph, variables and text assets, checked to run no file, Python or custom op; a .keras
    # file checked to hold no Lambda and no HDF5 link out (tensorflow/uploads.py).
    "tensorflow": Runtime(
        "dlscale.backends.tensorflow",
        "TensorflowBackend",
        ("model.savedmodel", "model.keras"),
        "tensorflow_savedmodel",
        extra="tensorflow",
        triton_names=("tensorflow_savedmodel", "tensorflow"),
        uploads=(
            "saved_model.pb",
            "fingerprint.pb",
            "variables.index",
            "variables.data-*-of-*",
            "*.keras",
            "*.txt",
        ),
        upload_check="dlscale.backends.tensorflow.uploads:check_upload",
    ),
    # No model: the tensors come from config.toml; an empty marker keeps version folders alike.
    "null": Runtime(
        "dlscale.backends.null",
        "NullBackend",
        ("model.null",),
        "dlscale_null",
        triton_names=("dlscale_null", "null"),
        uploads=("model.null",),
    ),
    # User code: dlscale's `Model` class or Triton's `TritonPythonModel` (docs/backends.md). It
    # runs with the server's rights, so it comes from the repository only.
    "python": Runtime(
        "dlscale.backends.python",
        "PythonBackend",
        ("model.py",),
        "python",
        triton_names=("python",),
    ),
    # Built-in processing steps (docs/processing.md): no model file, their settings are the
    # config's [backend_options]; the marker keeps version folders alike. The tokenizer reads
    # the `tokenizers` file its folder holds.
    "image": Runtime(
        "dlscale.backends.processing.image",
        "ImageBackend",
        ("model.image",),
        "dlscale_image",
        uploads=("model.image",),
    ),
    "tokenizer": Runtime(
        "dlscale.backends.processing.tokenizer",
        "TokenizerBackend",
        ("tokenizer.json",),
        "dlscale_tokenizer",
        uploads=("tokenizer.json",),
    ),
    "topk": Runtime(
        "dlscale.backends.processing.topk",
        "TopKBackend",
        ("model.topk",),
        "dlscale_topk",
        uploads=("model.topk", "*.txt"),
    ),
    # Generative engines (docs/generative.md) load a Hugging Face folder: the version folder
    # holds config.json, the weights and the tokenizer.
    "transformers": Runtime(
        "dlscale.backends.generative.transformers",
        "TransformersBackend",
        ("config.json",),
        "transformers",
        extra="llm",
        uploads=_HF_DATA,
    ),
    # A Triton vLLM-backend model keeps vLLM's engine arguments in model.json instead; those
    # can name classes for vLLM to import, so a model.json comes from the repository only.
    "vllm": Runtime(
        "dlscale.backends.generative.vllm",
        "VllmBackend",
        ("config.json", "model.json"),
        "vllm",
        extra="vllm",
        triton_names=("vllm",),
        uploads=_HF_DATA,
    ),
    # A LoRA adapter (Hugging Face PEFT's folder) served on its base model's engine: no
    # backend of its own (serving/adapters.py); both files are data. In a config.pbtxt or a
    # load request's JSON config: backend "lora", parameters { key: "base" ... }.
    "lora": Runtime(
        "dlscale.backends.generative.lora_files",
        "AdapterSpec",
        ("adapter_config.json",),
        "lora",
        extra="llm",
        triton_names=("lora",),
        uploads=("adapter_config.json", "adapter_model.safetensors"),
        upload_check="dlscale.backends.generative.lora_files:check_upload",
    ),
}

#: Backend name in config.toml -> the file names its model is stored under in a version folder.
MODEL_FILES: dict[str, tuple[str, ...]] = {name: r.model_files for name, r in RUNTIMES.items()}


def uploadable(backend: str, file_name: str) -> bool:
    """Whether a load request may upload a file of this name for a model of `backend`."""
    runtime = RUNTIMES.get(backend)
    return runtime is not None and any(
        fnmatch.fnmatchcase(file_name, pattern) for pattern in runtime.uploads
    )


def check_upload(backend: str, file_name: str, data: bytes) -> None:
    """Run the backend's check of an uploaded file's bytes, where it has one (`upload_check`)."""
    runtime = RUNTIMES.get(backend)
    if runtime is None or not runtime.upload_check:
        return
    module, function = runtime.upload_check.split(":")
    getattr(importlib.import_module(module), function)(file_name, data)


def create_backend(kind: str, path: Path, options: BackendOptions) -> Backend:
    """A backend of the named kind for the model file at `path`, not yet loaded.

    Runtimes are imported here, lazily, so that a machine without one runtime (an optional
    extra) still serves models of the others; a missing runtime is a ConfigError naming the
    extra that installs it.
    """
    if kind not in RUNTIMES:
        raise ConfigError(f"unknown backend {kind!r}: expected one of {sorted(RUNTIMES)}")
    runtime = RUNTIMES[kind]
    try:
        module = importlib.import_module(runtime.module)
    except ModuleNotFoundError as exc:
        if not runtime.extra or (exc.name or "").startswith("dlscale"):
            raise
        raise ConfigError(
            f"backend {kind!r} needs {exc.name}, which is not installed; "
            f"pip install 'dlscale[{runtime.extra}]'"
        ) from None
    backend: Backend = getattr(module, runtime.cls)(path, options)
    return backend


__all__ = [
    "MODEL_FILES",
    "RUNTIMES",
    "Backend",
    "BackendOptions",
    "Capabilities",
    "Runtime",
    "check_upload",
    "create_backend",
    "uploadable",
]
