"""The transformers engine's settings, from a model's [backend_options] (docs/generative.md).

Kept apart from the engine (transformers_engine.py) so that the rules on each option, its
default and its bound, are read in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from dlscale.backends.base import BackendOptions
from dlscale.backends.generative.contract import chat_template_file
from dlscale.backends.generative.lora_files import MAX_RANK
from dlscale.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The KV cache a CPU engine takes unless told (the server's memory is shared with others).
CPU_KV_CACHE_GIB = 1.0
#: Tokens in one CPU step unless told. transformers' default (8192) sizes an SDPA attention
#: mask of 8192 x (8192 + the cache's tokens) floats, GBs, reset in part at every step.
CPU_BATCH_TOKENS = 256
#: Adapters an engine holds at once, and their largest rank, unless told (vLLM's max_lora_rank).
DEFAULT_MAX_LORAS = 8
DEFAULT_MAX_LORA_RANK = 16


@dataclass(frozen=True)
class EngineSettings:
    """How to run the engine: device, precision and the paged KV cache's size."""

    device: str = "cpu"
    dtype: str = "float32"
    #: KV-cache size in GiB; None on a GPU: `gpu_memory_fraction` of its free memory.
    kv_cache_gib: float | None = CPU_KV_CACHE_GIB
    gpu_memory_fraction: float = 0.8
    #: Tokens per KV-cache page (transformers' block).
    page_size: int = 64
    max_batch_tokens: int | None = None
    #: Sequences in one step (the seats in front of the engine read the same key).
    max_num_seqs: int | None = None
    attn_implementation: str = "sdpa"
    #: PyTorch's threads in the engine's thread; 0 leaves PyTorch's default (one per core).
    threads: int = 0
    #: Prompt plus generated tokens a sequence may hold (vLLM's name); None: the model's own
    #: max_position_embeddings.
    max_model_len: int | None = None
    #: A Jinja chat template file that replaces the tokenizer's (vLLM's --chat-template).
    chat_template: Path | None = None
    #: LoRA adapters (vLLM's names): served on this engine, at most `max_loras` at once, each
    #: of rank at most `max_lora_rank` (lora_layers.py).
    enable_lora: bool = False
    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK

    @classmethod
    def from_options(cls, options: BackendOptions) -> EngineSettings:
        """The settings [backend_options] name; FP32 on a CPU and BF16 on a GPU by default."""
        extra = dict(options.extra)
        unknown = sorted(set(extra) - set(OPTION_KEYS))
        if unknown:
            raise ConfigError(
                f"transformers backend: unknown backend_options {unknown}; "
                f"it reads {list(OPTION_KEYS)}"
            )
        on_gpu = options.device.startswith("cuda")
        dtype = str(extra.get("dtype", "bfloat16" if on_gpu else "float32"))
        if dtype not in DTYPES:
            raise ConfigError(f"transformers backend: dtype must be one of {list(DTYPES)}")
        gib = extra.get("kv_cache_gib", None if on_gpu else CPU_KV_CACHE_GIB)
        fraction = float(_positive("gpu_memory_fraction", extra.get("gpu_memory_fraction", 0.8)))
        if fraction > 1:
            raise ConfigError("transformers backend: gpu_memory_fraction must be at most 1")
        return cls(
            device=options.device,
            dtype=dtype,
            kv_cache_gib=None if gib is None else float(_positive("kv_cache_gib", gib)),
            gpu_memory_fraction=fraction,
            page_size=int(_positive("page_size", extra.get("page_size", 64))),
            max_batch_tokens=_optional(extra, "max_batch_tokens")
            or (None if on_gpu else CPU_BATCH_TOKENS),
            max_num_seqs=_optional(extra, "max_num_seqs"),
            attn_implementation=str(extra.get("attn_implementation", "sdpa")),
            threads=options.intra_op_threads,
            max_model_len=_optional(extra, "max_model_len"),
            chat_template=chat_template_file(extra, "transformers backend: "),
            enable_lora=_flag(extra, "enable_lora"),
            max_loras=_optional(extra, "max_loras") or DEFAULT_MAX_LORAS,
            max_lora_rank=min(_optional(extra, "max_lora_rank") or DEFAULT_MAX_LORA_RANK, MAX_RANK),
        )


#: The [backend_options] keys this engine reads: its settings but the device and the thread
#: count, which come from the instance.
OPTION_KEYS = tuple(f.name for f in fields(EngineSettings) if f.name not in ("device", "threads"))


def _positive(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"transformers backend: {key} must be a positive number, not {value!r}")
    return value


def _flag(extra: Mapping[str, Any], key: str) -> bool:
    value = extra.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"transformers backend: {key} must be true or false, not {value!r}")
    return value


def _optional(extra: Mapping[str, Any], key: str) -> int | None:
    return int(_positive(key, extra[key])) if key in extra else None
