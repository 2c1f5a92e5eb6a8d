"""The vLLM engine's settings: a model's [backend_options], or a Triton vLLM model's model.json.

Read without importing vLLM, so that a repository is checked (and these rules tested) on a
machine without the `vllm` extra. dlscale names a few engine arguments in [backend_options]
(docs/generative.md); a Triton vLLM-backend model keeps its `model.json` of engine arguments in
the version folder, as Triton's vLLM backend reads it (shared/reference/generative.md), and
dlscale passes those through. Weights are never downloaded: the model must be a local folder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.backends.generative.contract import chat_template_file
from dlscale.errors import ConfigError

#: The file a Triton vLLM-backend model keeps in its version folder: vLLM's engine arguments.
TRITON_MODEL_JSON = "model.json"
#: The Hugging Face folder's file that the repository finds a dlscale vLLM model by.
HF_CONFIG = "config.json"
#: The largest model.json read (it holds a few settings, never weights).
MAX_MODEL_JSON_BYTES = 64 * 1024

#: [backend_options] keys that are vLLM engine arguments of the same name, and their types.
ENGINE_KEYS: dict[str, type] = {
    "max_num_seqs": int,
    "max_model_len": int,
    "max_num_batched_tokens": int,
    "dtype": str,
    "enforce_eager": bool,
    "enable_prefix_caching": bool,
    "gpu_memory_utilization": float,
    "tensor_parallel_size": int,
    "seed": int,
    # LoRA adapters (docs/generative.md, "LoRA adapters"): vLLM's own engine arguments.
    "enable_lora": bool,
    "max_loras": int,
    "max_lora_rank": int,
}
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: KV-cache size in GiB: vLLM's `kv_cache_memory_bytes` (on CPUs it replaces
#: VLLM_CPU_KVCACHE_SPACE, whose default is 4 GiB).
KV_CACHE_KEY = "kv_cache_gib"
#: A Jinja chat template file that replaces the tokenizer's (vLLM's --chat-template); dlscale
#: renders chat messages itself, so it is no engine argument.
CHAT_TEMPLATE_KEY = "chat_template"
#: vLLM's CPU thread settings, environment variables of its engine processes:
#: cores to bind its OpenMP threads to ("auto", "nobind", "0-3", ranks split by "|"), and
#: cores left to the server when binding automatically.
ENV_KEYS = {
    "cpu_threads_bind": "VLLM_CPU_OMP_THREADS_BIND",
    "cpu_reserved_cores": "VLLM_CPU_NUM_OF_RESERVED_CPU",
}
_BIND = re.compile(r"^(auto|nobind|[0-9,|-]+)$")
_GIB = 2**30


@dataclass(frozen=True)
class EngineSettings:
    """What the engine is built from: vLLM's engine arguments and its processes' environment."""

    folder: Path
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    chat_template: Path | None = None


def engine_settings(model_file: Path, options: Mapping[str, Any], device: str) -> EngineSettings:
    """The settings for the model file the repository found (config.json or model.json)."""
    args: dict[str, Any] = {}
    if model_file.name == TRITON_MODEL_JSON:
        args.update(_triton_model_json(model_file))
        folder = Path(args.pop("model"))
    else:
        folder = model_file.parent
    args.update(_engine_args(options))
    env = _environment(options, device)
    return EngineSettings(folder, args, env, chat_template_file(options, "backend_options."))


def _engine_args(options: Mapping[str, Any]) -> dict[str, Any]:
    known = {*ENGINE_KEYS, KV_CACHE_KEY, CHAT_TEMPLATE_KEY, *ENV_KEYS}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"backend_options {unknown} are not vLLM settings dlscale knows; it takes "
            f"{sorted(known)} (other engine arguments: a Triton-style model.json)"
        )
    args = {
        key: _typed(key, options[key], kind) for key, kind in ENGINE_KEYS.items() if key in options
    }
    if "dtype" in args and args["dtype"] not in DTYPES:
        raise ConfigError(f"backend_options.dtype must be one of {DTYPES}, not {args['dtype']!r}")
    if KV_CACHE_KEY in options:
        gib = _typed(KV_CACHE_KEY, options[KV_CACHE_KEY], float)
        args["kv_cache_memory_bytes"] = int(gib * _GIB)
    return args


def _typed(key: str, value: Any, kind: type) -> Any:
    """`value` as `kind`, ConfigError naming the key otherwise; numbers must be positive."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"backend_options.{key} must be a {kind.__name__}, not {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
        raise ConfigError(f"backend_options.{key} must be greater than 0, not {value}")
    if key == "gpu_memory_utilization" and isinstance(value, float) and value > 1:
        raise ConfigError(f"backend_options.{key} is a share of memory, at most 1, not {value}")
    return value


def _environment(options: Mapping[str, Any], device: str) -> dict[str, str]:
    env: dict[str, str] = {}
    bind = options.get("cpu_threads_bind")
    if bind is not None:
        if not isinstance(bind, str) or not _BIND.match(bind):
            raise ConfigError(
                "backend_options.cpu_threads_bind is 'auto', 'nobind' or core ids such as "
                f"'0-3' ('|' between ranks), not {bind!r}"
            )
        env[ENV_KEYS["cpu_threads_bind"]] = bind
    reserved = options.get("cpu_reserved_cores")
    if reserved is not None:
        if isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < 0:
            raise ConfigError(
                f"backend_options.cpu_reserved_cores must be a count >= 0, not {reserved!r}"
            )
        env[ENV_KEYS["cpu_reserved_cores"]] = str(reserved)
    if device.startswith("cuda:"):  # the engine's processes see that GPU alone, as its device 0
        env["CUDA_VISIBLE_DEVICES"] = device.removeprefix("cuda:")
    return env


def _triton_model_json(path: Path) -> dict[str, Any]:
    """A Triton vLLM model's engine arguments; its `model` must be a local folder."""
    if path.stat().st_size > MAX_MODEL_JSON_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_MODEL_JSON_BYTES} bytes")
    try:
        args = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from None
    if not isinstance(args, dict) or not isinstance(args.get("model"), str):
        raise ConfigError(f"{path}: a JSON object of vLLM engine arguments naming its 'model'")
    # Confined to the model's own folder: a model.json may come with an uploaded model.
    home = path.parent.parent.resolve()
    model = (path.parent / args["model"]).resolve()
    if not model.is_relative_to(home) or not (model / HF_CONFIG).is_file():
        raise ConfigError(
            f"{path}: 'model' {args['model']!r} is not a Hugging Face folder inside {home} "
            "(dlscale never downloads weights): give the path of a folder holding config.json, "
            "relative to the version folder"
        )
    args["model"] = str(model)
    return args
