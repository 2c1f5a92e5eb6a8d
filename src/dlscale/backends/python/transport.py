"""What a worker process and its server exchange: typed messages, tensors in shared memory.

Numeric arrays travel in the sender's shared-memory segment (its `Arena`; the pipe carries only
their names, dtypes, shapes and offsets), and the receiver copies them out (`Reader`). BYTES
(object) arrays have no fixed layout and travel pickled. Segments are named by the server's one
rule (wire/segments.py), so that no client can register them as regions, and each one this
process makes or attaches is recorded as the server's (`segments.OWN`) whatever its name.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import numpy as np

from dlscale import errors
from dlscale.backends.python.custom_metrics import SeriesState
from dlscale.errors import BackendError, DlscaleError
from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire import segments

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Slot:
    """Where one array lies in the message's segment."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Packed:
    """Arrays of several mappings: numeric ones in the sender's `segment`, object ones inline."""

    segment: str | None
    slots: tuple[tuple[Slot, ...], ...]
    objects: tuple[Arrays, ...]


class Arena:
    """The shared-memory segment one side writes the tensors of its messages into.

    One segment, reused: its pages stay mapped, so a message costs a copy in and a copy out.
    Reuse is safe because each side waits for the other's reply before it sends again, and a
    receiver copies the arrays out before it replies. A message larger than the segment gets a
    new, larger one (the reader attaches to it by its new name).
    """

    def __init__(self, prefix: str) -> None:
        #: Names start with it (wire/segments.py): the region registry refuses them, and the
        #: server removes what a crashed worker left (`segments.sweep`).
        self.prefix = prefix
        self._shm: shared_memory.SharedMemory | None = None
        self._identity: segments.Identity | None = None

    def pack(self, mappings: Sequence[Mapping[str, np.ndarray]]) -> Packed:
        """Write the numeric arrays of `mappings` into the segment (grown when too small)."""
        layouts: list[tuple[Slot, ...]] = []
        objects: list[Arrays] = []
        size = 0
        for arrays in mappings:
            layout, inline = [], {}
            for name, array in arrays.items():
                if array.dtype.hasobject:
                    inline[name] = array
                    continue
                layout.append(Slot(name, array.dtype.str, array.shape, size))
                size += (array.nbytes + 63) // 64 * 64  # aligned for any dtype
            layouts.append(tuple(layout))
            objects.append(inline)
        if not size:
            return Packed(None, tuple(layouts), tuple(objects))
        shm = self._room(size)
        for arrays, placed in zip(mappings, layouts, strict=True):
            for slot in placed:
                array = arrays[slot.name]
                np.ndarray(array.shape, array.dtype, shm.buf, slot.offset)[...] = array
        return Packed(shm.name, tuple(layouts), tuple(objects))

    def _room(self, size: int) -> shared_memory.SharedMemory:
        if self._shm is not None and self._shm.size >= size:
            return self._shm
        self.close()
        grown = max(size, 1 << 20) * 3 // 2
        self._shm = shared_memory.SharedMemory(
            segments.new_name(self.prefix), create=True, size=grown
        )
        self._identity = _own(self._shm.name)
        return self._shm

    def close(self) -> None:
        """Unlink the segment (the reader's mapping stays valid until it lets go)."""
        shm, self._shm = self._shm, None
        _disown(self._identity)
        self._identity = None
        if shm is not None:
            shm.close()
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()


class Reader:
    """The other side's arena, attached once per segment name."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None
        self._identity: segments.Identity | None = None

    def unpack(self, packed: Packed) -> list[Arrays]:
        """The arrays of a message, copied out of the other side's segment."""
        if packed.segment is None:
            return [dict(o) for o in packed.objects]
        if self._shm is None or self._shm.name != packed.segment:
            self.close()
            if not packed.segment.startswith(segments.RESERVED_PREFIX):
                raise BackendError(f"a segment outside the server's names: {packed.segment!r}")
            self._shm = shared_memory.SharedMemory(packed.segment)
            self._identity = _own(self._shm.name)
        buf = self._shm.buf
        out = []
        for slots, inline in zip(packed.slots, packed.objects, strict=True):
            arrays = {
                s.name: np.ndarray(s.shape, np.dtype(s.dtype), buf, s.offset).copy() for s in slots
            }
            out.append({**arrays, **inline})
        return out

    def close(self) -> None:
        """Let go of the segment (its owner unlinks it, or the server sweeps a dead worker's)."""
        shm, self._shm = self._shm, None
        _disown(self._identity)
        self._identity = None
        if shm is not None:
            shm.close()


def _own(name: str) -> segments.Identity:
    """Record a segment this process made or attached as the server's (never a region)."""
    info = os.stat(segments.SHM_DIR / name, follow_symlinks=False)
    identity = (info.st_dev, info.st_ino)
    segments.OWN.add(identity)
    return identity


def _disown(identity: segments.Identity | None) -> None:
    if identity is not None:
        segments.OWN.discard(identity)


# -- messages -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorInfo:
    """A DlscaleError across the pipe: its class name, message and any user traceback."""

    kind: str
    message: str
    trace: str = ""

    @classmethod
    def of(cls, exc: DlscaleError) -> ErrorInfo:
        """The error's picture."""
        return cls(type(exc).__name__, str(exc), getattr(exc, "trace", ""))

    def error(self) -> DlscaleError:
        """The error again (BackendError for a class the errors module lacks)."""
        kind = getattr(errors, self.kind, None)
        if isinstance(kind, type) and issubclass(kind, DlscaleError):
            return kind(self.message)
        return BackendError(self.message)


@dataclass(frozen=True)
class Ready:
    """The worker loaded the model (error: it could not)."""

    error: ErrorInfo | None = None
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker


@dataclass(frozen=True)
class Run:
    """Compute one batch given as its requests."""

    inputs: Packed


@dataclass(frozen=True)
class Done:
    """The batch's results: outputs for each request, or its error (`errors[i]` not None)."""

    outputs: Packed
    errors: tuple[ErrorInfo | None, ...]
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker


@dataclass(frozen=True)
class Failed:
    """The whole batch failed (user code raised)."""

    error: ErrorInfo
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker


@dataclass(frozen=True)
class Call:
    """A BLS call from user code: the request without its inputs, which are packed; `stream`:
    every response of the model is wanted (Triton's `exec(decoupled=True)`)."""

    request: InferenceRequest
    inputs: Packed
    metrics: tuple[SeriesState, ...] = ()  # custom metrics changed in the worker
    stream: bool = False


@dataclass(frozen=True)
class Answer:
    """The server's answer to a Call: the response without its outputs, or the error; a
    streamed call's responses (`more`, outputs packed in their order)."""

    response: InferenceResponse | None
    outputs: Packed | None = None
    error: ErrorInfo | None = None
    more: tuple[InferenceResponse, ...] = ()


@dataclass(frozen=True)
class Stop:
    """Unload the model and exit."""

    reason: str = field(default="unload")
