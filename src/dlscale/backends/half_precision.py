"""Which 16-bit float types a CPU multiplies natively, read from its flags (no torch import).

Without native dot products PyTorch emulates a 16-bit type on the CPU, slower than FP32 itself:
resnet50 in BF16 on an AVX2-only AMD EPYC took 12-14 s for 3 rows against 2 s in FP32
(2026-12-02, docs/backends.md). The torch backend warns when a model asks for one there, and
`dlscale optimize` does not try it.
"""

from __future__ import annotations

#: The CPU flags of native dot products for each 16-bit float type.
HALF_DOT_FLAGS: dict[str, frozenset[str]] = {
    "bf16": frozenset({"avx512_bf16", "amx_bf16"}),
    "fp16": frozenset({"amx_fp16"}),
}


def emulated(precision: str, flags: frozenset[str]) -> bool:
    """Whether a CPU with `flags` emulates `precision` (False when its flags are unknown)."""
    needs = HALF_DOT_FLAGS.get(precision)
    return bool(needs and flags and not flags & needs)
