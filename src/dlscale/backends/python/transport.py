"""The messages between a Python model's worker process and its server.

They travel on the one transport between the server's processes (wire/channel.py) over the
worker's pipe: numeric tensors in the sender's arena (wire/segments.py `Arena`, named by the
server's rule so that no client can register it as a region), copied out by the receiver as it
decodes (`Attached`); everything else, BYTES arrays included, pickled in band. Errors cross as
themselves (`channel.portable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from dlscale.backends.python.custom_metrics import SeriesState
from dlscale.errors import DlscaleError
from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire import channel
from dlscale.wire.segments import Arena, Attached, tensor_bytes

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Ready:
    """The worker loaded the model (error: it could not)."""

    error: DlscaleError | None = None
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker
    #: Whether the model has its own `is_ready` (the server then asks it with `AskReady`).
    checks_ready: bool = False


@dataclass(frozen=True)
class AskReady:
    """Call the model's is_ready: on the worker's readiness pipe, answered beside its batches."""


@dataclass(frozen=True)
class Readiness:
    """The answer to AskReady: the model's True or False, or the error its is_ready raised."""

    ready: bool
    error: DlscaleError | None = None


@dataclass(frozen=True)
class Run:
    """Compute one batch given as its requests."""

    requests: list[Arrays]


@dataclass(frozen=True)
class Done:
    """The batch's results: each request's outputs, or its error."""

    results: list[Arrays | DlscaleError]
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker


@dataclass(frozen=True)
class Failed:
    """The whole batch failed (user code raised)."""

    error: DlscaleError
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker


@dataclass(frozen=True)
class BlsCall:
    """A call of another model from user code (Triton's BLS); `stream`: every response of the
    model is wanted (Triton's `exec(decoupled=True)`)."""

    request: InferenceRequest
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker
    stream: bool = False


@dataclass(frozen=True)
class Answer:
    """The server's answer to a BlsCall: the response, or the error; a streamed call's
    responses (`more`, in their order)."""

    response: InferenceResponse | None
    error: DlscaleError | None = None
    more: tuple[InferenceResponse, ...] = ()


@dataclass(frozen=True)
class Stop:
    """Unload the model and exit."""


class Pipe:
    """One side of a worker's pipe: its arena for what it sends, the other's for what it reads."""

    def __init__(self, conn: Connection, prefix: str) -> None:
        self.conn = conn
        self._arena = Arena(prefix)
        self._attached = Attached()

    def send(self, message: Any, *tensors: Arrays) -> None:
        """Send `message`; `tensors` are the mappings in it whose numeric arrays go in the arena
        (every one: the pipe carries only their descriptors)."""
        place = self._arena.placer(tensor_bytes(*tensors, min_bytes=1))
        channel.send(self.conn, message, place, min_bytes=1)

    def receive(self) -> Any:
        """The next message, its tensors copied out of the other side's arena."""
        return channel.receive(self.conn, self._attached.copy)

    def close(self) -> None:
        """Let go of both arenas (the pipe itself is closed by its owner)."""
        self._attached.close()
        self._arena.close()
