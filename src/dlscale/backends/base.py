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


@dataclass(frozen=True)
class Capabilities:
    """What a loaded backend can do, declared by the backend so that callers never probe it."""

    #: Batches it takes at once: an Instance runs that many calls in parallel threads.
    concurrency: int = 1
    #: The device whose memory it takes inputs from in place ("cuda:N"), None: host arrays only.
    device_buffers: str | None = None
    #: Whether it answers one request with a stream of responses (generative models).
    streams_answers: bool = False
    #: Whether its model calls other models of the server (pipelines, user code).
    calls_models: bool = False


@runtime_checkable
class Backend(Protocol):
    """A runtime holding one model on one device.

    `load` does the slow work (read the file, compile, capture) and must leave the backend able
    to run `infer` at once; `infer` takes and returns numpy arrays keyed by tensor name, batch
    first, and releases the GIL while it computes, so that an Instance can call it from a worker
    thread without stalling the event loop. `capabilities`, read after `load`, declares what
    else it can do (`Capabilities`): how many batches it takes at once (the torch backend on a
    GPU uploads one batch while it computes another), whether it reads device buffers in place.
    """

    path: Path
    options: BackendOptions

    def load(self) -> None: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def inputs(self) -> list[TensorSpec]: ...

    @property
    def outputs(self) -> list[TensorSpec]: ...

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def unload(self) -> None: ...
