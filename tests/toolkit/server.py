"""The one server the tests talk to: dlscale's Server in a background thread, on free ports."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from tests.toolkit.waiting import until

from dlscale.frontends.grpc import GrpcFrontend
from dlscale.frontends.rest import HttpFrontend
from dlscale.server import ALL_MODELS, ServerSettings, ServerThread
from dlscale.serving.dataplane import DataPlane

HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback port free now, for servers that cannot be asked for port 0 (the Ray fleet's
    router, peers): one below the kernel's ephemeral range, where no bind to port 0 and no
    outgoing connection is given a port. A port from that range could be handed to another
    test's socket before the server bound it (seen: the fleet's router refused, "Address
    already in use", and four Ray tests erred)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _PORTS.randrange(max(1024, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:  # taken: another
                continue
            return port
    with socket.socket() as s:  # a host with no room below its range
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


_PORTS = random.Random()  # seeded by the OS: two test workers pick apart


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def settings_for(root: Path, **changes: Any) -> ServerSettings:
    """REST and gRPC on ports the OS picks, no metrics port, every model loaded under explicit
    control (so the tests may load and unload), a 4 MiB body limit; `changes` override these,
    a Limits field (max_body_bytes, head_timeout_s, ...) among them."""
    tls = changes.pop("tls", None)
    if tls is not None:  # the three TLS settings, from one TlsFiles
        changes.update(tls_cert=tls.cert, tls_key=tls.key, tls_client_ca=tls.client_ca)
    settings = ServerSettings.build(
        root,
        host=HOST,
        http_port=0,
        grpc_port=0,
        metrics_port=None,
        model_control="explicit",
        load_models=(ALL_MODELS,),
        max_body_bytes=4 * 2**20,
        grace_s=5.0,
    )
    return settings.replace(**changes)


class LocalServer(ServerThread):
    """A started ServerThread and the addresses its clients need."""

    @property
    def dataplane(self) -> DataPlane:
        return self.server.dataplane

    @property
    def http(self) -> HttpFrontend:
        """The REST frontend (tests stop it on its own to watch a graceful stop)."""
        return cast(HttpFrontend, self.server.frontends["http"])

    @property
    def grpc(self) -> GrpcFrontend:
        return cast(GrpcFrontend, self.server.frontends["grpc"])

    @property
    def http_url(self) -> str:
        """host:port of the REST frontend, as tritonclient wants it."""
        return f"{HOST}:{self.server.ports['http']}"

    @property
    def grpc_url(self) -> str:
        """host:port of the gRPC frontend."""
        return f"{HOST}:{self.server.ports['grpc']}"

    def until_computing(self, model: str) -> None:
        """Return once a request sent to `model` is in its instance's thread (held, none left
        in its batcher's queue): a request sent after it then queues behind it."""
        served = self.dataplane.manager.get(model)
        batcher = getattr(served.runner, "batcher")  # noqa: B009 (a BatchRunner's)
        until(lambda: bool(served.stats.pending) and not batcher.queued)


@contextmanager
def serving(root: Path, **changes: Any) -> Iterator[LocalServer]:
    """A started server over the repository at `root` (settings_for's, with `changes`)."""
    with LocalServer(settings_for(root, **changes)) as server:
        yield server
