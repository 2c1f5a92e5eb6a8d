"""A Hugging Face folder given to `dlscale serve` (as to `vllm serve DIR`): one generative model.

The folder (config.json, a tokenizer, weights) is served as the one model of a repository
written for it in a temporary folder: `NAME/config.toml` from vLLM's flags (the `Generative`
group) and `NAME/1`, a link to the folder. Each flag becomes the engine's option of the same
meaning, or is refused naming what to use instead where the engine has no such setting
(docs/generative.md, "vLLM's flags").
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

from dlscale.errors import ConfigError
from dlscale.server_settings.generative import DTYPE_NAMES, Generative
from dlscale.serving.regions import cuda

#: The file that makes a folder a Hugging Face model (and not a repository).
HF_CONFIG = "config.json"
#: What else it needs, each by one of these file patterns.
NEEDED = {
    "a tokenizer (tokenizer.json, tokenizer.model or vocab.json)": (
        "tokenizer.json",
        "tokenizer.model",
        "vocab.json",
    ),
    "weights (*.safetensors or pytorch_model*.bin)": ("*.safetensors", "pytorch_model*.bin"),
}


def is_hf_folder(path: Path) -> bool:
    """Whether `path` is given as a Hugging Face folder (it holds config.json)."""
    return (path / HF_CONFIG).is_file()


def lacks(folder: Path) -> list[str]:
    """What a Hugging Face folder lacks to be served (empty: nothing)."""
    return [what for what, globs in NEEDED.items() if not any(any(folder.glob(g)) for g in globs)]


def one_model_repository(folder: Path, generative: Generative) -> Path:
    """A temporary repository (removed at exit) serving `folder` as its one model."""
    missing = lacks(folder)
    if missing:
        raise ConfigError(
            f"{folder} holds {HF_CONFIG} but not {' nor '.join(missing)}: a Hugging Face "
            "folder is served with config.json, a tokenizer and weights"
        )
    name = generative.served_model_name or _default_name(folder)
    if not name or "/" in name or name.startswith((".", "_")):
        raise ConfigError(
            f"--served-model-name {name!r}: a model name has no '/' and starts with neither "
            "'.' nor '_'"
        )
    config = model_config(folder, name, generative)
    root = Path(tempfile.mkdtemp(prefix="dlscale-hf-"))
    atexit.register(shutil.rmtree, root, True)
    (root / name).mkdir()
    (root / name / "1").symlink_to(folder.resolve(), target_is_directory=True)
    (root / name / "config.toml").write_text(tomli_w.dumps(config))
    return root


def _default_name(folder: Path) -> str:
    """The folder's name; a version folder's (`llama/1`) is its model's (`llama`)."""
    resolved = folder.resolve()
    return resolved.parent.name if resolved.name.isdigit() else resolved.name


def model_config(folder: Path, name: str, generative: Generative) -> dict[str, Any]:
    """The config.toml of the one model, as a TOML document."""
    device = generative.device or ("cuda:0" if cuda.device_count() > 0 else "cpu")
    options = _OPTIONS[generative.engine](generative, device)
    length = generative.max_model_len or _positions(folder)
    metadata: dict[str, Any] = {"source": str(folder.resolve())}
    if length:
        metadata["max_model_len"] = length  # what /v1/models says
    return {
        "name": name,
        "backend": generative.engine,
        "max_batch_size": 0,
        "instances": [{"count": 1, "device": device}],
        "backend_options": options,
        "metadata": metadata,
    }


def _positions(folder: Path) -> int | None:
    """The model's own context (config.json's max_position_embeddings), when it says one."""
    try:
        value = json.loads((folder / HF_CONFIG).read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _common(generative: Generative) -> dict[str, Any]:
    """The options both engines name alike."""
    options: dict[str, Any] = {}
    if generative.max_model_len is not None:
        options["max_model_len"] = generative.max_model_len
    if generative.dtype != "auto":
        options["dtype"] = DTYPE_NAMES.get(generative.dtype, generative.dtype)
    if generative.kv_cache_memory_bytes is not None:
        options["kv_cache_gib"] = generative.kv_cache_memory_bytes / 2**30
    if generative.chat_template is not None:
        template = generative.chat_template.resolve()
        if not template.is_file():
            raise ConfigError(f"--chat-template {generative.chat_template}: no such file")
        options["chat_template"] = str(template)
    return options


def _transformers(generative: Generative, device: str) -> dict[str, Any]:
    options = _common(generative)
    if generative.tensor_parallel_size > 1:
        raise ConfigError(
            "--tensor-parallel-size: the transformers engine runs a model on one device; "
            "--engine vllm splits it over several (or serve copies: instances in a config.toml)"
        )
    if generative.enable_prefix_caching is False:
        raise ConfigError(
            "--no-enable-prefix-caching: the transformers engine always shares the KV-cache "
            "blocks of common prefixes; --engine vllm can turn it off"
        )
    if generative.gpu_memory_utilization is not None:
        if not device.startswith("cuda"):
            raise ConfigError(
                "--gpu-memory-utilization: this model runs on the CPU; size its KV cache with "
                "--kv-cache-memory-bytes"
            )
        options["gpu_memory_fraction"] = generative.gpu_memory_utilization
    return options


def _vllm(generative: Generative, device: str) -> dict[str, Any]:
    options = _common(generative)
    if generative.enable_prefix_caching is not None:
        options["enable_prefix_caching"] = generative.enable_prefix_caching
    if generative.gpu_memory_utilization is not None:
        options["gpu_memory_utilization"] = generative.gpu_memory_utilization
    if generative.tensor_parallel_size > 1:
        options["tensor_parallel_size"] = generative.tensor_parallel_size
    return options


_OPTIONS: dict[str, Callable[[Generative, str], dict[str, Any]]] = {
    "transformers": _transformers,
    "vllm": _vllm,
}
