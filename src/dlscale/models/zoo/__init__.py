"""The built-in model zoo: models defined in PyTorch, built into ONNX with seeded weights."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dlscale.errors import NotFound
from dlscale.models.zoo.catalog import DECODERS, ZOO
from dlscale.models.zoo.decoder import DecoderModel
from dlscale.models.zoo.e2e import PIPELINES, ZooPipeline
from dlscale.models.zoo.model import ZooModel

__all__ = [
    "DECODERS",
    "PIPELINES",
    "ZOO",
    "DecoderModel",
    "ZooModel",
    "ZooPipeline",
    "build_zoo",
    "get",
]


def get(name: str) -> ZooModel:
    """The zoo model called `name`; raises NotFound naming the models there are."""
    try:
        return ZOO[name]
    except KeyError:
        known = ", ".join([*ZOO, *PIPELINES, *DECODERS])
        raise NotFound(f"no zoo model {name!r}; the zoo has: {known}") from None


def build_zoo(
    root: Path,
    names: Sequence[str] | None = None,
    *,
    seq_len: int = 128,
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Build the named zoo models (all by default) into repository `root`; returns their folders.

    A name may be an end-to-end pipeline's (PIPELINES): its steps and classifier are built with
    it; or a generative decoder's (DECODERS). By default only the tensor models are built.
    """
    models = [_buildable(name) for name in (names if names is not None else list(ZOO))]
    say = progress or (lambda message: None)
    folders = []
    start = time.perf_counter()
    for model in models:
        say(f"building {model.name} into {root / model.name}")
        if isinstance(model, ZooPipeline):
            folders.append(model.build(root))
        else:
            folders.append(model.build(root, seq_len=seq_len))
        # Said as each model ends, not when all have: a reader of a log sees which one is slow.
        say(f"built {folders[-1]} ({time.perf_counter() - start:.1f} s so far)")
    return folders


def _buildable(name: str) -> ZooModel | ZooPipeline | DecoderModel:
    """A classic zoo model, an end-to-end pipeline or a generative decoder (by name only)."""
    if name in DECODERS:
        return DECODERS[name]
    if name in PIPELINES:
        return PIPELINES[name]
    if name not in ZOO:
        every = ", ".join([*ZOO, *PIPELINES, *DECODERS])
        raise NotFound(f"no zoo model {name!r}; the zoo has: {every}")
    return ZOO[name]
