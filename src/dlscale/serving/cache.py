"""Triton's response cache: identical requests answered from memory, bounded by bytes.

A request's key is a digest of what decides its answer: the model and version, each input's name,
datatype, shape and bytes, and the outputs asked for (with their classification counts). Answers are
held as read-only copies, least recently used first out when the byte budget is spent; an answer
larger than the whole budget is not kept. Requests whose tensors live in shared-memory regions are
not cached: their bytes belong to the client and can change under the same region name. A key names
the loads that compute the answer too: the model's, and those of every model it uses (a pipeline's
steps, nested pipelines' steps, the models a Python model called), so that reloading any of them
keeps the previous loads' answers from answering again; they age out of the LRU order. One cache
serves every model whose config enables it (`response_cache`), as Triton's `--cache-config
local,size=N` does.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dlscale.errors import DlscaleError
from dlscale.types import InferenceRequest

if TYPE_CHECKING:
    from dlscale.serving.served import ServedVersion

#: A loaded version by name and version ("" for the newest): the model manager's `get`.
Lookup = Callable[[str, str], "ServedVersion"]
#: Bytes the key reserves for each held answer beside its arrays (dict, digest, bookkeeping).
ENTRY_OVERHEAD = 256


@dataclass(frozen=True)
class _Entry:
    outputs: dict[str, np.ndarray]
    size: int


def request_key(
    model: str,
    version: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[tuple[str, int]],
) -> bytes:
    """The digest that identifies a request's answer: model, version, every input (name,
    datatype, shape, bytes) in name order, and the (output, class count) pairs asked for."""
    digest = hashlib.blake2b(digest_size=32)
    for part in (model, version):
        digest.update(part.encode() + b"\0")
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype == object:
            # BYTES tensors: each element's length, then its bytes (no separator can collide).
            for item in array.reshape(-1):
                raw = item if isinstance(item, bytes) else str(item).encode()
                digest.update(len(raw).to_bytes(8, "little") + raw)
        else:
            digest.update(array.data.cast("B"))
    for name, classes in sorted(outputs):
        digest.update(f"out\0{name}\0{classes}\0".encode())
    return digest.digest()


def load_marks(served: ServedVersion, lookup: Lookup) -> str:
    """The loads that compute a model's answers, as text: its own and, transitively, those of
    the models it uses (a pipeline's steps, the models its code has called), each once."""
    marks: set[str] = set()
    seen: set[int] = set()
    pending = [served]
    while pending:
        current = pending.pop()
        if current.serial in seen:  # a model used twice, or models that call each other
            continue
        seen.add(current.serial)
        marks.add(f"{current.version.name}/{current.version.version}#{current.serial}")
        steps = current.pipeline.steps if current.pipeline is not None else ()
        used = {(s.model, s.version_text) for s in steps}
        for name, version in used | set(current.called):
            try:
                pending.append(lookup(name, version))
            except DlscaleError:  # not served now: its answers cannot be this one's anyway
                marks.add(f"{name}/{version}#-")
    return ";".join(sorted(marks))


class ResponseCache:
    """An LRU map from request keys to answers, holding at most `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"cache size {capacity}: expected >= 0 bytes")
        self.capacity = capacity
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._bytes = 0

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The answer held for `key` (most recently used from now on), or None."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found.outputs

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> bool:
        """Hold a copy of `outputs` under `key`; False when it is larger than the whole cache."""
        size = ENTRY_OVERHEAD + sum(_nbytes(a) for a in outputs.values())
        if size > self.capacity:
            return False
        if key in self._entries:
            self._drop(key)
        while self._bytes + size > self.capacity:
            self._drop(next(iter(self._entries)))
        held = {name: _frozen(array) for name, array in outputs.items()}
        self._entries[key] = _Entry(held, size)
        self._bytes += size
        return True

    def _drop(self, key: bytes) -> None:
        self._bytes -= self._entries.pop(key).size


def _nbytes(array: np.ndarray) -> int:
    if array.dtype == object:
        return sum(len(x) if isinstance(x, bytes) else len(str(x)) for x in array.reshape(-1))
    return int(array.nbytes)


def _frozen(array: np.ndarray) -> np.ndarray:
    # A copy: the answer's arrays may be views of a batch buffer that is reused.
    held = np.array(array, copy=True)
    held.flags.writeable = False
    return held


@dataclass
class CacheLookup:
    """One request's look into the cache: its key, the answer found (None: a miss), and the
    nanoseconds spent so far (the lookup; on a miss the insertion is added by `keep`)."""

    cache: ResponseCache
    served: ServedVersion
    key: bytes
    answer: dict[str, np.ndarray] | None
    ns: int

    @classmethod
    def find(
        cls,
        cache: ResponseCache,
        served: ServedVersion,
        request: InferenceRequest,
        wanted: Mapping[str, int],
        lookup: Lookup,
    ) -> CacheLookup:
        """Look the request up (its key covers the outputs and class counts it asks for, and
        the loads that compute them)."""
        start = time.perf_counter_ns()
        # The loads' serials, not only the version: a reloaded model may answer otherwise.
        loads = load_marks(served, lookup)
        key = request_key(served.version.name, loads, request.inputs, list(wanted.items()))
        answer = cache.get(key)
        return cls(cache, served, key, answer, time.perf_counter_ns() - start)

    def keep(self, answer: Mapping[str, np.ndarray]) -> None:
        """A miss: hold the computed answer, and count the miss with the time it took."""
        start = time.perf_counter_ns()
        self.cache.put(self.key, answer)
        self.served.stats.cache_miss.add(self.ns + time.perf_counter_ns() - start)
