"""The server's own shared-memory objects: one naming rule, their allocators, and the objects
this process made or mapped.

The one transport between the server's processes (wire/channel.py) places large tensors in these
objects: a REST worker's body segments (`Segments`, one per body, read in place by the owner) and
each side of a Python model worker's pipe (`Arena`, one reused segment, copied out by the other
side's `Attached`). All are named here: `RESERVED_PREFIX`, the owning server process's id, a
scope, then a random token. The region registry refuses any name with the prefix, and any object
recorded in `OWN` whatever name reaches it (a rename keeps the object, so a name check alone is
not enough). The owner removes what a crashed worker left with `sweep(prefix)`. It lives in `wire`
because both `backends` and `frontends`/`serving` use it (docs/shared-memory.md).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import threading
import weakref
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from dlscale.wire.channel import OUT_OF_BAND_BYTES, Descriptor, Place

#: Where POSIX shared-memory objects lie on Linux (shm_open's names).
SHM_DIR = Path("/dev/shm")
#: The server's own shared-memory objects start with this; no client may register such a key.
RESERVED_PREFIX = "dlscale."
#: (device, inode): which object a descriptor or a name leads to, whatever the name.
Identity = tuple[int, int]


def scope_prefix(scope: str) -> str:
    """The prefix of every object of one `scope` (a worker) of this server process."""
    return f"{RESERVED_PREFIX}{os.getpid()}.{scope}."


def new_name(prefix: str) -> str:
    """A fresh object name under `prefix`: the random token makes it unguessable."""
    return f"{prefix}{secrets.token_hex(12)}"


def sweep(prefix: str) -> int:
    """Unlink the shared-memory objects whose names start with `prefix`; how many were."""
    if not prefix.startswith(RESERVED_PREFIX):
        raise ValueError(f"sweep only removes the server's own objects, not {prefix!r}*")
    count = 0
    for path in SHM_DIR.glob(f"{prefix}*"):
        path.unlink(missing_ok=True)
        count += 1
    return count


class OwnObjects:
    """The objects (identities) this process's server side made or mapped: never a region.

    One per process, because the Python backend's worker segments are known to the backend,
    the REST workers' to their host, and the registry (which refuses both) to neither.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._own: set[Identity] = set()

    def add(self, identity: Identity) -> None:
        """Declare an object the server made or mapped."""
        with self._lock:
            self._own.add(identity)

    def discard(self, identity: Identity) -> None:
        """The server is done with an object (its inode may be reused by a client's)."""
        with self._lock:
            self._own.discard(identity)

    def __contains__(self, identity: object) -> bool:
        with self._lock:
            return identity in self._own


#: The server's objects in this process.
OWN = OwnObjects()


def own(name: str) -> Identity:
    """Record object `name`, which this process made or mapped, as the server's (never a region)."""
    info = os.stat(SHM_DIR / name, follow_symlinks=False)
    identity = (info.st_dev, info.st_ino)
    OWN.add(identity)
    return identity


def address(buffer: memoryview | np.ndarray) -> int:
    """Where a buffer's first byte lies in this process."""
    if isinstance(buffer, np.ndarray):
        return int(buffer.ctypes.data)
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


#: Placed buffers start on this boundary: aligned for any dtype.
ALIGN = 64


def filling(space: memoryview, key: str) -> Place:
    """Place buffers one after another in `space` (object `key`), while they fit."""
    cursor = 0

    def place(buffer: memoryview) -> Descriptor | None:
        nonlocal cursor
        start = -(-cursor // ALIGN) * ALIGN
        if start + buffer.nbytes > space.nbytes:
            return None
        target = np.frombuffer(space, np.uint8, buffer.nbytes, start)
        # copyto handles a buffer that overlaps its place (a view of an input in this space).
        np.copyto(target, np.frombuffer(buffer, np.uint8))
        cursor = start + buffer.nbytes
        return key, start, buffer.nbytes

    return place


class Segments:
    """Shared-memory segments one REST worker creates for request bodies; unlinked when dropped.

    `allocate` is the body pool's allocator (frontends/rest/body.py): the pool reuses a segment
    once nothing refers to it, so a segment stays the worker's until its request is answered.
    A buffer that lies in one is sent as its descriptor (`locate`), read in place by the owner.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        #: key -> (first address, size, the segment's array, weakly)
        self._live: dict[str, tuple[int, int, weakref.ref[np.ndarray]]] = {}
        #: Keys dropped since the owner was last told (it unmaps them).
        self.dropped: list[str] = []

    def allocate(self, size: int) -> np.ndarray:
        """A new segment of `size` bytes as a writable uint8 array."""
        key = new_name(self.prefix)
        path = SHM_DIR / key
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        array = np.frombuffer(mapping, np.uint8)
        self._live[key] = (address(array), size, weakref.ref(array))
        weakref.finalize(array, self._drop, key, path)
        return array

    def _drop(self, key: str, path: Path) -> None:
        self._live.pop(key, None)
        path.unlink(missing_ok=True)
        self.dropped.append(key)

    def locate(self, buffer: memoryview | np.ndarray) -> Descriptor | None:
        """The descriptor of a buffer inside one of the segments, else None."""
        start = address(buffer)
        for key, (first, size, _) in self._live.items():
            if first <= start and start + buffer.nbytes <= first + size:
                return key, start - first, buffer.nbytes
        return None

    def segment(self, key: str) -> np.ndarray | None:
        """The live array of segment `key` (None once dropped)."""
        entry = self._live.get(key)
        return entry[2]() if entry is not None else None

    def view(self, spot: Descriptor) -> memoryview:
        """The bytes a descriptor names in one of these segments."""
        key, offset, size = spot
        array = self.segment(key)
        if array is None:
            raise ValueError(f"segment {key!r} is gone")
        return array[offset : offset + size].data

    def close(self) -> None:
        """Unlink every segment's name (mappings go with their last array)."""
        for key in list(self._live):
            (SHM_DIR / key).unlink(missing_ok=True)


class Arena:
    """The one segment a side of a pipe writes its messages' large tensors into, reused.

    Its pages stay mapped, so a tensor costs a copy in and a copy out. Reuse is safe because each
    side waits for the other's reply before it sends again, and the receiver copies the tensors
    out (`Attached`) as it decodes. A message larger than the segment gets a new, larger one.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._shm: shared_memory.SharedMemory | None = None
        self._identity: Identity | None = None

    def placer(self, need: int) -> Place | None:
        """Where one message's large buffers go, `need` bytes at most (None: all in band)."""
        if need <= 0:
            return None
        if self._shm is None or self._shm.size < need:
            self.close()
            grown = max(need, 1 << 20) * 3 // 2
            self._shm = shared_memory.SharedMemory(new_name(self.prefix), create=True, size=grown)
            self._identity = own(self._shm.name)
        assert self._shm.buf is not None  # open until close()
        return filling(self._shm.buf, self._shm.name)

    def close(self) -> None:
        """Unlink the segment (the other side's mapping stays valid until it lets go)."""
        shm, self._shm = self._shm, None
        _disown(self._identity)
        self._identity = None
        if shm is not None:
            shm.close()
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()


class Attached:
    """The other side's arena, attached once per segment name; resolves descriptors to copies."""

    def __init__(self) -> None:
        self._shm: shared_memory.SharedMemory | None = None
        self._identity: Identity | None = None

    def copy(self, spot: Descriptor) -> memoryview:
        """The bytes `spot` names, copied out (the other side reuses its arena) into memory
        numpy allocates, so the arrays made of them are aligned and writable."""
        key, offset, size = spot
        if self._shm is None or self._shm.name != key:
            self.close()
            if not key.startswith(RESERVED_PREFIX):
                raise ValueError(f"a segment outside the server's names: {key!r}")
            self._shm = shared_memory.SharedMemory(key)
            self._identity = own(key)
        assert self._shm.buf is not None  # open until close()
        return np.frombuffer(self._shm.buf, np.uint8, size, offset).copy().data

    def close(self) -> None:
        """Let go of the segment (its owner unlinks it, or the server sweeps a dead worker's)."""
        shm, self._shm = self._shm, None
        _disown(self._identity)
        self._identity = None
        if shm is not None:
            shm.close()


def _disown(identity: Identity | None) -> None:
    if identity is not None:
        OWN.discard(identity)


def tensor_bytes(*mappings: dict[str, np.ndarray], min_bytes: int = OUT_OF_BAND_BYTES) -> int:
    """The room the numeric arrays of at least `min_bytes` of `mappings` take in an arena."""
    return sum(
        -(-a.nbytes // ALIGN) * ALIGN
        for arrays in mappings
        for a in arrays.values()
        if not a.dtype.hasobject and a.nbytes >= min_bytes
    )
