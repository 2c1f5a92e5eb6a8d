"""Reading a file a model's config names: inside the model's folder, regular, bounded.

A config may come from a client (a load request's override), so every file it names is read
through here: a path that leaves the folder (`..`, a link out of it), a FIFO that would block the
server until a writer comes, or a file larger than the limit is refused with a ConfigError.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dlscale.errors import ConfigError


def read_confined(folder: Path, name: str, limit: int, what: str) -> bytes:
    """The bytes of `folder`/`name`, at most `limit`; `what` names the file in errors."""
    path = folder / name
    try:
        if not path.resolve().is_relative_to(folder.resolve()):
            raise _unreadable(what, name, "it must be a file inside the model's folder")
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise _unreadable(what, name, "not a regular file")
            data = file.read(limit + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise _unreadable(what, name, getattr(exc, "strerror", None) or str(exc)) from None
    if len(data) > limit:
        raise _unreadable(what, name, f"larger than the limit of {limit} bytes")
    return data


def _unreadable(what: str, name: str, why: str) -> ConfigError:
    return ConfigError(f"the {what} cannot be read ({name!r}): {why}")
