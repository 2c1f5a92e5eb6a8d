"""A system shared-memory region: a POSIX shared-memory object, mapped once with mmap.

tritonclient (and any POSIX client) creates the object with shm_open, which on Linux is the file
/dev/shm/KEY; the server opens that file and maps the registered window of it. Any process that
knows the key can map the same bytes (`shm_path`), which is what makes a region usable from
another process's side too.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from pathlib import Path

import numpy as np

from dlscale.errors import InvalidInput

SHM_DIR = Path("/dev/shm")
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


class SystemRegion:
    """`byte_size` bytes from `offset` of the object `key`, mapped read-write."""

    def __init__(self, key: str, offset: int, byte_size: int) -> None:
        if byte_size <= 0:
            raise InvalidInput(f"byte_size {byte_size}: a region holds at least one byte")
        path = shm_path(key)
        try:
            # O_NOFOLLOW: a key names an object, never a link to some other file.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InvalidInput(
                f"no shared-memory object with key {key!r} ({path}): create it (shm_open) "
                "before registering it"
            ) from None
        except OSError as exc:
            raise InvalidInput(f"shared-memory key {key!r} cannot be opened: {exc}") from None
        try:
            self._mmap = _map(fd, key, offset, byte_size)
        finally:
            os.close(fd)
        self._start = offset % mmap.ALLOCATIONGRANULARITY
        self.byte_size = byte_size
        self.address = _address(self._mmap) + self._start
        self.page_locked = False

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


def _map(fd: int, key: str, offset: int, byte_size: int) -> mmap.mmap:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"shared-memory key {key!r} is not a shared-memory object")
    if offset + byte_size > info.st_size:
        raise InvalidInput(
            f"offset {offset} + byte_size {byte_size} exceed the {info.st_size} bytes of the "
            f"shared-memory object {key!r}"
        )
    # mmap's offset must be a multiple of the allocation granularity: map from the one below.
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    return mmap.mmap(fd, byte_size + offset - start, offset=start)


def _address(mapping: mmap.mmap) -> int:
    view = np.frombuffer(mapping, dtype=np.uint8, count=1)
    address = int(view.ctypes.data)
    del view  # an export left alive would keep the mapping from ever closing
    return address
