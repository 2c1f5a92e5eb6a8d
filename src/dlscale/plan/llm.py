"""A decoder's shape from its Hugging Face config.json: parameters, bytes, KV cache, FLOPs.

Llama-like decoders (Llama, Mistral, Qwen, Mixtral-style mixtures of experts): every figure the
generative planner needs comes from the shape alone; docs/plan.md gives the formulas and their
sources. A config.json is user input: every field is checked and bounded before it is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dlscale.errors import PlanError

#: Bytes per element of the dtypes a config names (its `torch_dtype`, or `dtype` since
#: transformers 5), and the catalog precision whose peak applies to each.
DTYPES: dict[str, tuple[int, str]] = {
    "float32": (4, "fp32"),
    "float16": (2, "fp16"),
    "bfloat16": (2, "bf16"),
    "float8": (1, "fp8"),
    "int8": (1, "int8"),
}
_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_ALIASES |= {"fp8": "float8", "float8_e4m3fn": "float8", "float": "float32"}

#: A config.json (or measured kernels' file) larger than this is not one: they are a few KiB.
MAX_FILE_BYTES = 1 << 20
#: Bounds on each integer field: far above any published model, low enough that products fit.
_LIMITS = {"layers": 4096, "hidden": 1 << 20, "heads": 1 << 14, "vocab": 1 << 24}


@dataclass(frozen=True)
class DecoderShape:
    """What the planner reads of a decoder; `experts` is 0 for a dense model."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str
    tied_embeddings: bool = False
    max_positions: int | None = None
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0

    @property
    def element_bytes(self) -> int:
        """Bytes per weight and per KV-cache element (the cache is kept in the weights' dtype)."""
        return DTYPES[self.dtype][0]

    @property
    def precision(self) -> str:
        """The catalog precision whose peak applies (bfloat16 → bf16)."""
        return DTYPES[self.dtype][1]

    def with_dtype(self, dtype: str) -> DecoderShape:
        """The same shape served in another dtype (an engine casting on load)."""
        return replace(self, dtype=_dtype(dtype, "--dtype"))

    # -- parameters ----------------------------------------------------------------------------

    def _attention(self) -> int:
        # q and o: hidden x heads*head_dim each; k and v: hidden x kv_heads*head_dim each.
        return self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)

    def _mlp(self, count: int) -> int:
        """`count` gated MLPs (gate, up, down): 1 if dense, the chosen experts in a mixture."""
        width = self.expert_intermediate if self.experts else self.intermediate
        return count * 3 * self.hidden * width

    def _layers(self, mlps: int) -> int:
        """Every layer's attention, two norms, router (a mixture's) and `mlps` MLPs."""
        norms, router = 2 * self.hidden, self.hidden * self.experts
        return self.layers * (self._attention() + norms + router + self._mlp(mlps))

    @property
    def _vocab_matrix(self) -> int:
        # The embedding's parameters, and the head's: a tied head is the embedding matrix,
        # multiplied in full at the output all the same.
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        """Every parameter: layers, embedding, final norm, and the head unless tied."""
        head = 0 if self.tied_embeddings else self._vocab_matrix
        return self._layers(self.experts or 1) + self._vocab_matrix + self.hidden + head

    @property
    def active_parameters(self) -> int:
        """Parameters one token multiplies through (a mixture: its chosen experts only)."""
        return self._layers(self.experts_per_token or 1) + self.hidden + self._vocab_matrix

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights take in memory."""
        return self.parameters * self.element_bytes

    def step_weight_bytes(self, batch: int) -> float:
        """Weight bytes one decode step reads at `batch` sequences.

        Everything but the embedding table, of which only `batch` rows are gathered. A mixture
        reads the experts its tokens choose: with uniform routing, E x (1 - (1 - k/E)^batch) of
        the E experts per layer are touched (a stated assumption; real routing is skewed).
        """
        gather = 0 if self.tied_embeddings else batch * self.hidden  # a tied table is read whole
        mlps = 1.0
        if self.experts:
            k, e = self.experts_per_token, self.experts
            mlps = e * (1.0 - (1.0 - k / e) ** batch)
        fixed = self._layers(0) + self.hidden + self._vocab_matrix + gather
        return (fixed + self.layers * mlps * self._mlp(1)) * self.element_bytes

    # -- KV cache and FLOPs --------------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x head_dim x bytes (generative.md, capacity anchors)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.element_bytes

    def summary(self) -> str:
        """One line: the name, size, dtype and KV cost."""
        moe = (
            f", {self.experts} experts ({self.experts_per_token} per token)" if self.experts else ""
        )
        return (
            f"{self.name}: {self.parameters / 1e9:.3g}B parameters{moe}, {self.dtype}, "
            f"{self.layers} layers, KV {self.kv_bytes_per_token / 1024:.4g} KiB/token"
        )


def read_json(path: Path, what: str) -> Any:
    """The JSON in a user's file, refused above MAX_FILE_BYTES (then it is not `what`)."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise PlanError(f"{path}: {path.stat().st_size} bytes is not {what}")
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PlanError(f"cannot read {path}: {exc}") from None


def read_config(folder: Path, name: str | None = None) -> DecoderShape:
    """The shape in `folder`/config.json (or a config.json path itself)."""
    path = folder if folder.is_file() else folder / "config.json"
    raw = read_json(path, "a model config")
    return from_config(raw, name or (path.parent.name if path.name == "config.json" else path.stem))


def from_config(raw: Any, name: str) -> DecoderShape:
    """A DecoderShape from a parsed config.json; a PlanError names the field that is wrong."""
    if not isinstance(raw, Mapping):
        raise PlanError(f"{name}: config.json must hold a JSON object")
    if "text_config" in raw and "num_hidden_layers" not in raw:
        raw = raw["text_config"]  # multimodal wrappers keep the decoder's figures here
        if not isinstance(raw, Mapping):
            raise PlanError(f"{name}: text_config must be a JSON object")
    hidden = _int(raw, "hidden_size", name, _LIMITS["hidden"])
    heads = _int(raw, "num_attention_heads", name, _LIMITS["heads"])
    kv_heads = _int(raw, "num_key_value_heads", name, heads, default=heads)
    if heads % kv_heads:
        raise PlanError(f"{name}: num_attention_heads {heads} is not a multiple of {kv_heads} KV")
    head_dim = _int(raw, "head_dim", name, _LIMITS["hidden"], default=hidden // heads)
    experts = _int(raw, "num_local_experts", name, 4096, default=0, low=0)
    experts = experts or _int(raw, "num_experts", name, 4096, default=0, low=0)
    per_token = _int(raw, "num_experts_per_tok", name, max(experts, 1), default=0, low=0)
    if experts and not per_token:
        raise PlanError(f"{name}: a mixture of {experts} experts needs num_experts_per_tok")
    intermediate = _int(raw, "intermediate_size", name, _LIMITS["hidden"] * 8)
    expert_inter = _int(raw, "moe_intermediate_size", name, _LIMITS["hidden"] * 8, intermediate)
    dtype = raw.get("torch_dtype") or raw.get("dtype") or "float32"
    positions = _int(raw, "max_position_embeddings", name, 1 << 30, default=0, low=0) or None
    return DecoderShape(
        name=name,
        layers=_int(raw, "num_hidden_layers", name, _LIMITS["layers"]),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=_int(raw, "vocab_size", name, _LIMITS["vocab"]),
        dtype=_dtype(dtype, f"{name}: dtype"),
        tied_embeddings=raw.get("tie_word_embeddings") is True,
        max_positions=positions,
        experts=experts,
        experts_per_token=per_token if experts else 0,
        expert_intermediate=expert_inter if experts else 0,
    )


def _int(
    raw: Mapping[str, Any],
    key: str,
    name: str,
    high: int,
    default: int | None = None,
    low: int = 1,
) -> int:
    value = raw.get(key, default)
    if value is None:
        raise PlanError(f"{name}: config.json has no {key} (a Llama-like decoder's config?)")
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError(f"{name}: {key} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def _dtype(value: Any, what: str) -> str:
    key = str(value).lower()
    key = _ALIASES.get(key, key)
    if key not in DTYPES:
        raise PlanError(f"{what} {value!r} is not one of {', '.join(DTYPES)}")
    return key
