"""HAProxy's log of each request, for a benchmark: which replica answered, how long it queued.

The router's configuration (scale/haproxy_config.py) logs nothing; `logged` adds, for the
routers started inside it, a `log` line sending each request's record (syslog over UDP) to a
socket read here: the server that took it, the time it waited in HAProxy's queue (`%Tw`), the
time to the replica's answer (`%Tr`) and the request's whole time in HAProxy (`%Ta`; HAProxy
2.6's configuration.txt, 8.2.4 "Custom log format" and 8.4 "Timing events").
"""

from __future__ import annotations

import socket
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlscale.scale import haproxy

#: The fields of each line, in order (after syslog's header, which ends at the tag's ": ").
FORMAT = "%b %s %Tw %Tr %Ta %ST"


@dataclass
class Entry:
    """One request as HAProxy logged it."""

    server: str
    queue_ms: int
    answer_ms: int
    total_ms: int
    status: int


@dataclass
class Log:
    """The entries received while `logged` was open (a thread appends)."""

    entries: list[Entry] = field(default_factory=list)

    def since(self, start: int) -> list[Entry]:
        """The entries from index `start` (taken before a measured window) on."""
        return list(self.entries[start:])


def parse(line: str) -> Entry | None:
    """The entry of one syslog line, or None for another kind of line."""
    parts = line.rsplit(": ", 1)[-1].split()
    if len(parts) != 6 or parts[0] != "rest":
        return None
    try:
        return Entry(parts[1], int(parts[2]), int(parts[3]), int(parts[4]), int(parts[5]))
    except ValueError:
        return None


@contextmanager
def logged() -> Iterator[Log]:
    """Routers started inside log each request here."""
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.2)
    port = receiver.getsockname()[1]
    log, stop = Log(), threading.Event()
    original = haproxy.render

    def render(*args: Any, **kwargs: Any) -> str:
        text = original(*args, **kwargs)
        extra = f"  log 127.0.0.1:{port} len 4096 local0\n  log-format '{FORMAT}'\n"
        return text.replace("defaults\n", "defaults\n" + extra, 1)

    def receive() -> None:
        while not stop.is_set():
            try:
                data = receiver.recv(8192)
            except TimeoutError:
                continue
            entry = parse(data.decode(errors="replace"))
            if entry is not None:
                log.entries.append(entry)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    haproxy.render = render  # type: ignore[assignment]
    try:
        yield log
    finally:
        haproxy.render = original  # type: ignore[assignment]
        stop.set()
        thread.join()
        receiver.close()


def breakdown(entries: list[Entry], names: dict[str, str]) -> dict[str, Any]:
    """Per replica (HAProxy's server `rN` named by `names`): requests, their queue and total
    times; and which replicas the slowest 1% of requests went to."""
    if not entries:
        return {}
    totals = np.array([e.total_ms for e in entries])
    cut = float(np.percentile(totals, 99))
    tail = [e for e in entries if e.total_ms >= cut]
    per: dict[str, Any] = {}
    for server in sorted({e.server for e in entries}):
        mine = [e for e in entries if e.server == server]
        ms = np.array([e.total_ms for e in mine])
        queued = [e.queue_ms for e in mine]
        per[names.get(server, server)] = {
            "requests": len(mine),
            "share": round(len(mine) / len(entries), 3),
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "queued": sum(q > 0 for q in queued),
            "queue_p99_ms": float(np.percentile(queued, 99)),
            "tail_share": round(sum(e.server == server for e in tail) / len(tail), 3),
        }
    return {"p99_in_haproxy_ms": cut, "tail_median_ms": statistics.median(e.total_ms for e in tail),
            "servers": per}  # fmt: skip
