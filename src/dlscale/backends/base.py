"""The Backend protocol: one loaded copy of a model on one device, computing batches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dlscale.types import TensorSpec


@dataclass(frozen=True)
class BackendOptions:
    """How to load a model: where, with how many threads, at what optimization level."""

    device: str = "cpu"
    #: Threads inside one operator; 0 lets the runtime choose.
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    #: The config's max_batch_size (0: inputs have no batch dim); sizes batch buckets.
    max_batch_size: int = 0
    #: ONNX Runtime graph optimization: disable, basic, extended or all.
    graph_optimization_level: str = "all"
    #: Runtime-specific settings from the model config's [backend_options] table.
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The tensors config.toml declares (batch dim included as -1), empty when it declares
    #: none; a runtime without a model file to read them from (the null backend) serves these.
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()


@runtime_checkable
class Backend(Protocol):
    """A runtime holding one model on one device.

    `load` does the slow work (read the file, compile, capture) and must leave the backend able
    to run `infer` at once; `infer` takes and returns numpy arrays keyed by tensor name, batch
    first, and releases the GIL while it computes, so that an Instance can call it from a worker
    thread without stalling the event loop. A backend may also say, once loaded, how many
    batches it takes at once (an optional `concurrency` attribute, 1 when absent): an Instance
    then runs that many calls in parallel threads (the torch backend on a GPU uploads one
    batch while it computes another).
    """

    path: Path
    options: BackendOptions

    def load(self) -> None: ...

    @property
    def inputs(self) -> list[TensorSpec]: ...

    @property
    def outputs(self) -> list[TensorSpec]: ...

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def unload(self) -> None: ...
