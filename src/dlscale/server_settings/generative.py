"""vLLM's serve flags, for a Hugging Face folder served as one generative model."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import ConfigError
from dlscale.server_settings.fields import setting

#: Where vLLM's `--dtype` names differ from the engines' (dlscale's [backend_options].dtype).
DTYPE_NAMES = {"half": "float16", "float": "float32"}
DTYPES = ("auto", "float32", "bfloat16", "float16", *DTYPE_NAMES)
ENGINES = ("transformers", "vllm")


@dataclass(frozen=True)
class Generative:
    """A Hugging Face folder served as one generative model (`dlscale serve DIR`, as `vllm serve
    DIR`), with vLLM's flags; server_settings/hf_folder.py turns them into the model's config,
    and refuses them with a repository (each model's config.toml says the same there)."""

    served_model_name: str | None = setting(
        None, "the model's name (default: the folder's)", "--served-model-name", metavar="NAME"
    )
    engine: str = setting("transformers", "the engine that serves it", "--engine", choices=ENGINES)
    device: str | None = setting(
        None, "cpu or cuda:N (default: cuda:0 when a GPU is seen, else cpu)", "--device"
    )
    max_model_len: int | None = setting(
        None, "tokens a sequence may hold (default: the model's)", "--max-model-len", type=int
    )
    dtype: str = setting("auto", "weights' precision", "--dtype", choices=DTYPES)
    chat_template: Path | None = setting(
        None, "a Jinja chat template file, instead of the tokenizer's", "--chat-template",
        type=Path,
    )  # fmt: skip
    enable_prefix_caching: bool | None = setting(
        None,
        "reuse the KV cache of shared prompt prefixes (the transformers engine always does)",
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
    )
    gpu_memory_utilization: float | None = setting(
        None, "share of the GPU's memory the engine takes", "--gpu-memory-utilization",
        type=float,
    )  # fmt: skip
    kv_cache_memory_bytes: int | None = setting(
        None, "bytes of KV cache (default: the engine's)", "--kv-cache-memory-bytes", type=int
    )
    tensor_parallel_size: int = setting(
        1, "GPUs one copy spans (vLLM engine only)", "--tensor-parallel-size", "-tp", type=int
    )

    def __post_init__(self) -> None:
        for name in ("max_model_len", "kv_cache_memory_bytes", "tensor_parallel_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} {value}: 1 or more")
        share = self.gpu_memory_utilization
        if share is not None and not 0 < share <= 1:
            raise ConfigError(f"--gpu-memory-utilization {share}: a share, above 0 and at most 1")

    def given(self) -> list[str]:
        """The flags set to anything but their default (a repository takes none of them)."""
        return [
            (f.metadata["flags"][0])
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        ]
