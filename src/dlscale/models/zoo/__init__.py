"""The built-in model zoo: models defined in PyTorch (built into ONNX) or Keras (TensorFlow
files), with seeded weights."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dlscale.errors import ConfigError, NotFound
from dlscale.models.zoo.catalog import ZOO

# The generative decoders are built by name only (`dlscale zoo build DIR --models llama-tiny`):
# a build of the whole zoo leaves them out (the largest is GBs).
from dlscale.models.zoo.decoder import DECODERS, DecoderModel
from dlscale.models.zoo.e2e import PIPELINES, TFPipeline, ZooPipeline
from dlscale.models.zoo.lora import ADAPTERS, ZooAdapter
from dlscale.models.zoo.model import ZooModel
from dlscale.models.zoo.tf_zoo import TF_MODELS, TFZooModel

__all__ = [
    "ADAPTERS",
    "DECODERS",
    "PIPELINES",
    "TF_MODELS",
    "ZOO",
    "ZooModel",
    "build_zoo",
    "get",
]


#: What `build_zoo` builds by name.
Buildable = ZooModel | ZooPipeline | DecoderModel | TFZooModel | ZooAdapter


def get(name: str) -> ZooModel:
    """The zoo model called `name`; raises NotFound naming the models there are."""
    try:
        return ZOO[name]
    except KeyError:
        raise _unknown(name) from None


def build_zoo(
    root: Path,
    names: Sequence[str] | None = None,
    *,
    seq_len: int = 128,
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Build the named zoo models (all by default) into repository `root`; returns their folders.

    A name may be an end-to-end pipeline's (PIPELINES): its steps and classifier are built with
    it; a generative decoder's (DECODERS); or a TensorFlow model's (TF_MODELS). By default only
    the tensor models are built.
    """
    models: list[Buildable] = [
        _buildable(name) for name in (names if names is not None else list(ZOO))
    ]
    for model in models:  # all before any is built: a missing extra is told at once
        _check_extra(model)
    say = progress or (lambda message: None)
    folders = []
    start = time.perf_counter()
    for model in models:
        say(f"building {model.name} into {root / model.name}")
        folders.append(model.build(root, seq_len=seq_len))
        # Said as each model ends, not when all have: a reader of a log sees which one is slow.
        say(f"built {folders[-1]} ({time.perf_counter() - start:.1f} s so far)")
    return folders


#: What building each kind of zoo model imports, and the extra of dlscale that installs it.
#: The first kind a model is an instance of counts (a TFPipeline is a ZooPipeline too).
EXTRAS: dict[type, tuple[str, tuple[str, ...]]] = {
    TFZooModel: ("tensorflow", ("tensorflow", "keras")),
    TFPipeline: ("tensorflow", ("tensorflow", "keras")),
    DecoderModel: ("llm", ("torch", "transformers", "tokenizers", "safetensors")),
    ZooAdapter: ("llm", ("torch", "safetensors")),
    ZooModel: ("torch", ("torch", "onnxscript")),
    ZooPipeline: ("torch", ("torch", "onnxscript")),
}


def _check_extra(model: Buildable) -> None:
    """A ConfigError naming the extra and its install command when a module it needs is absent
    (found, not imported: torch's import alone takes seconds)."""
    extra, modules = next(v for kind, v in EXTRAS.items() if isinstance(model, kind))
    missing = [m for m in modules if not _installed(m)]
    if missing:
        raise ConfigError(
            f"zoo model {model.name!r} needs {', '.join(missing)}, from dlscale's [{extra}] "
            f"extra, which is not installed: pip install 'dlscale[{extra}]' (in a checkout: "
            f"pip install -e '.[{extra}]')"
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed package is not installed
        return False


def _buildable(name: str) -> Buildable:
    """A classic zoo model, an end-to-end pipeline, a TensorFlow model, a generative decoder or
    an adapter (by name only)."""
    tables: tuple[Mapping[str, Buildable], ...] = (DECODERS, ADAPTERS, TF_MODELS, PIPELINES, ZOO)
    for table in tables:
        if name in table:
            return table[name]
    raise _unknown(name)


def _unknown(name: str) -> NotFound:
    every = ", ".join([*ZOO, *PIPELINES, *DECODERS, *ADAPTERS, *TF_MODELS])
    return NotFound(f"no zoo model {name!r}; the zoo has: {every}")
