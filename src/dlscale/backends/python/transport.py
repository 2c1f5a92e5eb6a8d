"""What a worker process and its server exchange: typed messages, tensors in shared memory.

Numeric arrays travel in one shared-memory segment per message (the pipe carries only their
names, dtypes, shapes and offsets); the receiver copies them out and unlinks the segment. BYTES
(object) arrays have no fixed layout and travel pickled.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import numpy as np

from dlscale import errors
from dlscale.errors import BackendError, DlscaleError
from dlscale.types import InferenceRequest, InferenceResponse

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
    """Arrays of several mappings: numeric ones in `segment`, object ones inline."""

    segment: str | None
    slots: tuple[tuple[Slot, ...], ...]
    objects: tuple[Arrays, ...]


def pack(mappings: Sequence[Mapping[str, np.ndarray]]) -> Packed:
    """Write the numeric arrays of `mappings` into one new segment (none when all are empty)."""
    layouts: list[list[tuple[Slot, np.ndarray]]] = []
    objects: list[Arrays] = []
    size = 0
    for arrays in mappings:
        layout, inline = [], {}
        for name, array in arrays.items():
            if array.dtype.hasobject:
                inline[name] = array
                continue
            layout.append((Slot(name, array.dtype.str, array.shape, size), array))
            size += (array.nbytes + 63) // 64 * 64  # aligned for any dtype
        layouts.append(layout)
        objects.append(inline)
    segment = None
    if size:
        shm = shared_memory.SharedMemory(f"dlspy_{secrets.token_hex(8)}", create=True, size=size)
        try:
            for layout in layouts:
                for slot, array in layout:
                    view = np.ndarray(array.shape, array.dtype, shm.buf, slot.offset)
                    view[...] = array
                    del view
        finally:
            shm.close()
        segment = shm.name
    slots = tuple(tuple(s for s, _ in layout) for layout in layouts)
    return Packed(segment, slots, tuple(objects))


def unpack(packed: Packed) -> list[Arrays]:
    """The arrays back, copied out of the segment, which is then unlinked."""
    if packed.segment is None:
        return [dict(o) for o in packed.objects]
    shm = shared_memory.SharedMemory(packed.segment)
    try:
        out = []
        for slots, inline in zip(packed.slots, packed.objects, strict=True):
            arrays = {
                s.name: np.ndarray(s.shape, np.dtype(s.dtype), shm.buf, s.offset).copy()
                for s in slots
            }
            out.append({**arrays, **inline})
        return out
    finally:
        shm.close()
        shm.unlink()


def discard(packed: Packed) -> None:
    """Unlink a segment nobody will read (its reader died)."""
    if packed.segment is not None:
        with contextlib.suppress(FileNotFoundError):
            shm = shared_memory.SharedMemory(packed.segment)
            shm.close()
            shm.unlink()


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


@dataclass(frozen=True)
class Run:
    """Compute one batch given as its requests."""

    inputs: Packed


@dataclass(frozen=True)
class Done:
    """The batch's results: outputs for each request, or its error (`errors[i]` not None)."""

    outputs: Packed
    errors: tuple[ErrorInfo | None, ...]


@dataclass(frozen=True)
class Failed:
    """The whole batch failed (user code raised)."""

    error: ErrorInfo


@dataclass(frozen=True)
class Call:
    """A BLS call from user code: the request without its inputs, which are packed."""

    request: InferenceRequest
    inputs: Packed


@dataclass(frozen=True)
class Answer:
    """The server's answer to a Call: the response without its outputs, or the error."""

    response: InferenceResponse | None
    outputs: Packed | None = None
    error: ErrorInfo | None = None


@dataclass(frozen=True)
class Stop:
    """Unload the model and exit."""

    reason: str = field(default="unload")
