"""The messages between REST worker processes and the process that owns the models.

They travel on the one transport between the server's processes (wire/channel.py): a worker
receives large request bodies into its own shared-memory segments (wire/segments.py `Segments`,
given to the body pool), so an input decoded from a body is sent as its descriptor and the owner
maps the segment as a system shared-memory region (`serving.regions.system.SystemRegion`) and
reads the tensor in place; large outputs are written back into the request's segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlscale.wire.channel import Descriptor


@dataclass(frozen=True)
class Listening:
    """Worker to owner: the worker listens on `port` (its frontend started)."""

    port: int


@dataclass(frozen=True)
class PlaneCall:
    """Worker to owner: call a Plane method (`registry.<name>`: the shared-memory registry's).

    On the asynchronous channel `ident` pairs the reply with its call; `space` is the request's
    own body segment, where the owner may write large outputs back; `dropped` lists the segments
    the worker unlinked since its last call, which the owner unmaps.
    """

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    ident: int = 0
    space: Descriptor | None = None
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reply:
    """Owner to worker: the answer to call `ident`, or (ok False) the error it raised."""

    ident: int
    ok: bool
    value: Any


@dataclass(frozen=True)
class Part:
    """Owner to worker: one response of the stream that call `ident` opened (a Plane method
    declared `stream`); the stream ends with the call's `Reply` (ok, or the error that ended it)."""

    ident: int
    value: Any


@dataclass(frozen=True)
class Cancel:
    """Worker to owner: the client of stream `ident` left; the owner closes the stream, which
    frees the request's sequence in its engine at once."""

    ident: int
