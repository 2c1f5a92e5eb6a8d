"""The built-in model zoo: models defined in PyTorch, built into ONNX with seeded weights."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dlscale.errors import NotFound
from dlscale.models.zoo.catalog import DECODERS, ZOO
from dlscale.models.zoo.decoder import DecoderModel
from dlscale.models.zoo.model import ZooModel

__all__ = ["DECODERS", "ZOO", "DecoderModel", "ZooModel", "build_zoo", "get"]


def get(name: str) -> ZooModel:
    """The zoo model called `name`; raises NotFound naming the models there are."""
    try:
        return ZOO[name]
    except KeyError:
        raise NotFound(f"no zoo model {name!r}; the zoo has: {', '.join(ZOO)}") from None


def build_zoo(
    root: Path,
    names: Sequence[str] | None = None,
    *,
    seq_len: int = 128,
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Build the named zoo models (all by default) into repository `root`; returns their folders."""
    models = [_buildable(name) for name in (names if names is not None else list(ZOO))]
    say = progress or (lambda message: None)
    folders = []
    start = time.perf_counter()
    for model in models:
        say(f"building {model.name} into {root / model.name}")
        folders.append(model.build(root, seq_len=seq_len))
        # Said as each model ends, not when all have: a reader of a log sees which one is slow.
        say(f"built {folders[-1]} ({time.perf_counter() - start:.1f} s so far)")
    return folders


def _buildable(name: str) -> ZooModel | DecoderModel:
    """A classic zoo model or a generative decoder (built by name only), by name."""
    if name in DECODERS:
        return DECODERS[name]
    if name not in ZOO:
        every = ", ".join([*ZOO, *DECODERS])
        raise NotFound(f"no zoo model {name!r}; the zoo has: {every}")
    return ZOO[name]
