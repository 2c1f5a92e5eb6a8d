"""The server's own shared-memory objects: one naming rule, and the objects this process made.

Every transport between the server's processes (REST workers' body segments, Python model
workers' tensor segments) names its objects here: `RESERVED_PREFIX`, the owning server process's
id, a scope, then a random token. The region registry refuses any name with the prefix, and any
object recorded in `OWN` whatever name reaches it (a rename keeps the object, so a name check
alone is not enough). The owner removes what a crashed worker left with `sweep(prefix)`.
It lives in `wire` because both `backends` and `frontends`/`serving` use it (docs/shared-memory.md).
"""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path

#: Where POSIX shared-memory objects lie on Linux (shm_open's names).
SHM_DIR = Path("/dev/shm")
#: The server's own shared-memory objects start with this; no client may register such a key.
RESERVED_PREFIX = "dlscale."
#: (device, inode): which object a descriptor or a name leads to, whatever the name.
Identity = tuple[int, int]


def scope_prefix(scope: str, owner_pid: int | None = None) -> str:
    """The prefix of every object of one `scope` (a worker) of server process `owner_pid`."""
    pid = os.getpid() if owner_pid is None else owner_pid
    return f"{RESERVED_PREFIX}{pid}.{scope}."


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


def identity_of(fd: int) -> Identity:
    """The identity of the object open as `fd`."""
    info = os.fstat(fd)
    return info.st_dev, info.st_ino
