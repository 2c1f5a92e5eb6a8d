"""A system shared-memory region: a POSIX shared-memory object, mapped once with mmap.

tritonclient (and any POSIX client) creates the object with shm_open, which on Linux is the file
/dev/shm/KEY. The server's own segments (REST worker bodies) are mapped once (`SystemRegion`);
a client's object is a `ClientObject`: kept open, checked before each use, and read and written
with pread/pwrite, never through a mapping, because a client may truncate its object at any
moment and a mapping would then kill the server with SIGBUS (docs/shared-memory.md).
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from collections.abc import Container
from pathlib import Path

import numpy as np

from dlscale.errors import InvalidInput, PermissionDenied
from dlscale.wire.segments import RESERVED_PREFIX, SHM_DIR, Identity

__all__ = ["RESERVED_PREFIX", "SHM_DIR", "ClientObject", "Identity", "SystemRegion", "shm_path"]
#: Region names and keys: printable, no path separators, at most 128 characters.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+\-]{0,127}")


def check_name(name: str) -> str:
    """A region name as given, or InvalidInput saying what a name may hold."""
    if not _NAME.fullmatch(name):
        raise InvalidInput(
            f"shared-memory region name {name!r}: use 1 to 128 letters, digits and _ . : @ + - "
            "(not starting with a punctuation mark)"
        )
    return name


def shm_path(key: str) -> Path:
    """Where the POSIX shared-memory object `key` ("/name" or "name") lies on Linux."""
    bare = key.lstrip("/")
    if not _NAME.fullmatch(bare):
        raise InvalidInput(
            f"shared-memory key {key!r}: expected '/NAME' with NAME of letters, digits and "
            "_ . : @ + - (the name given to shm_open)"
        )
    return SHM_DIR / bare


def _open_object(key: str, path: Path, extra_flags: int) -> int:
    """A read-write descriptor of the object `key` at `path`, or InvalidInput saying why not."""
    try:
        # O_NOFOLLOW: a key names an object, never a link to some other file.
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | extra_flags)
    except FileNotFoundError:
        raise InvalidInput(
            f"no shared-memory object with key {key!r} ({path}): create it (shm_open) "
            "before registering it"
        ) from None
    except OSError as exc:
        raise InvalidInput(f"shared-memory key {key!r} cannot be opened: {exc}") from None


class SystemRegion:
    """`byte_size` bytes from `offset` of the server's own object `key`, mapped read-write."""

    def __init__(self, key: str, offset: int, byte_size: int) -> None:
        if byte_size <= 0:
            raise InvalidInput(f"byte_size {byte_size}: a region holds at least one byte")
        fd = _open_object(key, shm_path(key), 0)
        try:
            info = os.fstat(fd)
            self._mmap = _map(fd, info, key, offset, byte_size)
        finally:
            os.close(fd)
        #: Which object this is: the registry refuses it to clients whatever name reaches it.
        self.identity: Identity = (info.st_dev, info.st_ino)
        self._start = offset % mmap.ALLOCATIONGRANULARITY
        self.byte_size = byte_size
        self.address = _address(self._mmap) + self._start

    def view(self, offset: int, size: int) -> memoryview:
        """`size` bytes from `offset` of the region, without a copy (bounds checked by caller)."""
        start = self._start + offset
        return memoryview(self._mmap)[start : start + size]

    def close(self) -> bool:
        """Unmap; False while views of the mapping are still alive (retry later)."""
        try:
            self._mmap.close()
        except BufferError:
            return False
        return True


class ClientObject:
    """`byte_size` bytes from `offset` of a client's object `key`: kept open, copied in and out.

    Registration refuses the server's reserved names and objects (`own`), objects reachable
    under several names, and objects owned by a user not in `owners`. Each use checks that the
    name still leads to the same object and that it still holds the window, then copies with
    pread/pwrite: a truncation racing the copy makes a short read (an error), never SIGBUS.
    """

    def __init__(
        self,
        key: str,
        offset: int,
        byte_size: int,
        own: Container[Identity],
        owners: frozenset[int],
    ) -> None:
        path = shm_path(key)
        if path.name.startswith(RESERVED_PREFIX):
            raise PermissionDenied(
                f"shared-memory key {key!r}: names starting with {RESERVED_PREFIX!r} are the "
                "server's own and cannot be registered"
            )
        fd = _open_object(key, path, os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            _check_object(key, info, (offset, byte_size), own, owners)
        except BaseException:
            os.close(fd)
            raise
        self.key, self.offset, self.byte_size = key, offset, byte_size
        self.identity: Identity = (info.st_dev, info.st_ino)
        self._path = path
        self._fd = fd

    def read(self, offset: int, size: int) -> np.ndarray:
        """A private copy of `size` bytes from `offset` of the region (bounds checked by caller)."""
        self._check_live()
        copy = np.empty(size, np.uint8)
        target = copy.data
        done = 0
        while done < size:
            got = os.preadv(self._fd, [target[done:]], self.offset + offset + done)
            if got == 0:
                raise InvalidInput(self._shrunk("while the server read it"))
            done += got
        return copy

    def write(self, offset: int, data: memoryview) -> None:
        """Write `data` at `offset` of the region (bounds checked by caller)."""
        self._check_live()
        done = 0
        while done < data.nbytes:
            done += os.pwrite(self._fd, data[done:], self.offset + offset + done)

    def close(self) -> bool:
        """Close the object (the client's object stays the client's)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        return True

    def _check_live(self) -> None:
        try:
            named = os.stat(self._path, follow_symlinks=False)
        except FileNotFoundError:
            raise InvalidInput(
                f"the shared-memory object {self.key!r} was removed after registration: "
                "unregister the region and register it again"
            ) from None
        if (named.st_dev, named.st_ino) != self.identity:
            raise InvalidInput(
                f"the shared-memory object {self.key!r} was replaced after registration: "
                "unregister the region and register it again"
            )
        size = os.fstat(self._fd).st_size
        if size < self.offset + self.byte_size:
            raise InvalidInput(self._shrunk(f"to {size} bytes"))

    def _shrunk(self, how: str) -> str:
        return (
            f"the shared-memory object {self.key!r} shrank {how} after registration; the region "
            f"needs {self.offset + self.byte_size} bytes"
        )


def _check_object(
    key: str,
    info: os.stat_result,
    window: tuple[int, int],
    own: Container[Identity],
    owners: frozenset[int],
) -> None:
    """Refuse what a client may not register (the trust model of docs/shared-memory.md)."""
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"shared-memory key {key!r} is not a shared-memory object")
    if (info.st_dev, info.st_ino) in own or info.st_nlink != 1:
        # A second name (a hard link) is how a reserved object could reach a client's name.
        raise PermissionDenied(
            f"shared-memory key {key!r} leads to an object the server owns or one with several "
            "names; register an object of your own made with shm_open"
        )
    if info.st_uid not in owners:
        raise PermissionDenied(
            f"shared-memory key {key!r}: the object belongs to uid {info.st_uid}; this server "
            f"takes objects of uid {', '.join(map(str, sorted(owners)))} only"
        )
    _check_fits(key, info, *window)


def _check_fits(key: str, info: os.stat_result, offset: int, byte_size: int) -> None:
    if offset + byte_size > info.st_size:
        raise InvalidInput(
            f"offset {offset} + byte_size {byte_size} exceed the {info.st_size} bytes of the "
            f"shared-memory object {key!r}"
        )


def _map(fd: int, info: os.stat_result, key: str, offset: int, byte_size: int) -> mmap.mmap:
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"shared-memory key {key!r} is not a shared-memory object")
    _check_fits(key, info, offset, byte_size)
    # mmap's offset must be a multiple of the allocation granularity: map from the one below.
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    return mmap.mmap(fd, byte_size + offset - start, offset=start)


def _address(mapping: mmap.mmap) -> int:
    view = np.frombuffer(mapping, dtype=np.uint8, count=1)
    address = int(view.ctypes.data)
    del view  # an export left alive would keep the mapping from ever closing
    return address
