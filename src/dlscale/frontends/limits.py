"""Limits: every bound the frontends hold a client to, in one place (docs/limits.md).

The defaults follow what Triton and nginx ship (8 KiB request lines and header lines, a bounded
head, timeouts to receive a request) and keep one request's memory to a small multiple of the
body limit. `dlscale serve` sets each with a flag; ServerSettings carries them to the frontends.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlscale.wire.bounds import MAX_ELEMENTS

log = logging.getLogger("dlscale.limits")

#: File descriptors kept for everything but REST connections: gRPC, models, logs, metrics.
FD_RESERVE = 128
#: The limits where 0 means "none" (or, for reap_idle_s, "at once"); every other is positive.
_MAY_BE_ZERO = ("max_connections_per_peer", "reap_idle_s", "max_keep_alive_requests")


def _limit(default: Any, help: str) -> Any:
    """A field with its default and the one description the docs and `dlscale serve -h` show.

    Its flag, `--NAME N` after the field, comes from the generator of every setting group's
    flags (server_settings/flags.py): the metadata has the shape of server_settings' `setting`.
    """
    arg = {"type": type(default), "metavar": "N"}
    metadata = {"help": help, "flags": (), "convert": None, "arg": arg, "shown": f"{default:,}"}
    return field(default=default, metadata=metadata)


def _in_mib(mib: int, help: str, flag: str) -> Any:
    """A size in bytes whose flag takes MiB (`--max-body-mb 64`): the flag's default is in MiB."""
    arg = {"type": float, "default": float(mib)}
    metadata = {"help": help, "flags": (flag,), "convert": _bytes, "arg": arg, "shown": f"{mib:g}"}
    return field(default=mib * 2**20, metadata=metadata)


def _bytes(mib: float) -> int:
    return int(mib * 2**20)


@dataclass(frozen=True)
class Limits:
    """What one client may send and hold; a request over a limit gets a 4xx that names it."""

    #: REST body, before and after Content-Encoding (413).
    max_body_bytes: int = _in_mib(64, "REST body size limit in MiB", "--max-body-mb")
    #: gRPC message, each way (RESOURCE_EXHAUSTED).
    max_grpc_message_bytes: int = _in_mib(64, "gRPC message size limit in MiB", "--max-grpc-mb")
    max_tensor_elements: int = _limit(
        MAX_ELEMENTS, "elements one tensor may declare, whatever its bytes carry (400)"
    )
    max_url_bytes: int = _limit(8 * 2**10, "request target, path and query (414)")
    max_header_bytes: int = _limit(8 * 2**10, "one header line, name and value (431)")
    max_head_bytes: int = _limit(32 * 2**10, "request line and all headers together (431)")
    max_headers: int = _limit(100, "header lines in one request (431)")
    head_timeout_s: float = _limit(
        30.0, "seconds to receive a request head once it began, or a TLS handshake (408)"
    )
    body_timeout_s: float = _limit(120.0, "seconds to receive a body once its head came (408)")
    keep_alive_s: float = _limit(75.0, "seconds an idle connection stays open")
    max_keep_alive_requests: int = _limit(
        10_000, "requests per connection before it is closed after its answer (0: no limit)"
    )
    max_connections: int = _limit(
        1_000, "open connections per protocol; more get 503 (REST) or are refused (gRPC)"
    )
    max_connections_per_peer: int = _limit(
        256,
        "open connections one client address may hold, per protocol; more get 503 (REST) or are "
        "closed (gRPC, within a second); also the gRPC calls and streams it may have in flight, "
        "more are RESOURCE_EXHAUSTED (0: no limit; behind a proxy every client has the proxy's "
        "address)",
    )
    reap_idle_s: float = _limit(
        2.0,
        "seconds a keep-alive connection must have been idle before it is closed to make room for "
        "a new client when connections or descriptors run short",
    )
    max_stream_requests: int = _limit(
        64,
        "requests one gRPC ModelStreamInfer stream may have in flight; the stream is read no "
        "further until one of them ends (HTTP/2 flow control then holds the client back)",
    )
    max_stream_answers: int = _limit(
        16,
        "answers of one gRPC ModelStreamInfer stream waiting for the client to read them; past it "
        "the stream's requests wait to hand on theirs, and it is read no further",
    )
    unread_stream_timeout_s: float = _limit(
        30.0,
        "seconds a streamed answer (REST generate_stream and OpenAI streams, gRPC "
        "ModelStreamInfer) may wait for a client that does not read; then the stream is cut, its "
        "requests cancelled and their seats freed",
    )
    max_receiving_bytes: int = _limit(
        1 << 30,
        "REST body bytes received in place at once (declared lengths); over it a body grows as "
        "it arrives",
    )

    def __post_init__(self) -> None:
        for name in (f.name for f in dataclasses.fields(self) if f.name not in _MAY_BE_ZERO):
            if not getattr(self, name) > 0:  # `not >`: a NaN timeout is refused too
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_connections_per_peer < 0:
            raise ValueError("max_connections_per_peer must be 0 (no limit) or more")
        if self.reap_idle_s < 0:
            raise ValueError(f"reap_idle_s must be 0 or more, got {self.reap_idle_s}")
        if self.max_keep_alive_requests < 0:
            raise ValueError("max_keep_alive_requests must be 0 (no limit) or more")
        if not self.max_grpc_message_bytes < 2**31:
            raise ValueError("max_grpc_message_bytes must be below 2 GiB (gRPC's own limit)")


def connection_cap(wanted: int) -> int:
    """The REST connections this process can hold: `wanted`, or fewer when open files are short.

    The soft open-file limit is first raised to the hard one (as Go's runtime does), so that a
    default of 1,024 does not make new clients fail with a reset.
    """
    room = _descriptor_room()
    if room < wanted:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        log.warning(
            "open-file limit %d allows %d REST connections, not %d: raise it (ulimit -n) for more",
            soft,
            room,
            wanted,
        )
    return min(wanted, room)


class DescriptorBudget:
    """The file descriptors one serving process lends to clients: connections and regions.

    Every REST connection and every registered shared-memory region holds a descriptor; they
    draw on this one budget (the open-file limit less FD_RESERVE), so that neither can starve
    the other. When the budget is short, `acquire` first asks its reapers (the REST frontend
    closes its longest-idle keep-alive connection) and refuses only when none frees one.
    """

    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError(f"a descriptor budget must be positive, got {total}")
        self.total = total
        self.used = 0
        self._reapers: list[Callable[[], bool]] = []

    def acquire(self) -> bool:
        """Take one descriptor; False when none is left even after reaping an idle connection."""
        if self.used >= self.total and not any(reap() for reap in list(self._reapers)):
            return False
        self.used += 1
        return True

    def release(self) -> None:
        """Give back a descriptor taken with `acquire` (its connection or region closed)."""
        self.used = max(self.used - 1, 0)

    def add_reaper(self, reap: Callable[[], bool]) -> None:
        """`reap()` closes one idle holder and releases its descriptor, or returns False."""
        self._reapers.append(reap)

    def remove_reaper(self, reap: Callable[[], bool]) -> None:
        """Forget a reaper (its frontend stopped)."""
        if reap in self._reapers:
            self._reapers.remove(reap)


@functools.cache
def descriptor_budget() -> DescriptorBudget:
    """This process's one descriptor budget, made on first use from the open-file limit."""
    return DescriptorBudget(_descriptor_room())


def _descriptor_room() -> int:
    """Descriptors beyond the reserve, once the soft open-file limit is raised to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # the hard limit is the OS's word; keep the soft one
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(int(soft) - FD_RESERVE, 1)
