"""TensorFlow Serving's gRPC services on the gRPC port, when asked for (`--grpc-tfserving`).

They need the `tensorflow-serving-api` package, whose generated modules import TensorFlow's
protos and with them TensorFlow itself (seconds and hundreds of MB at start), so they are off
unless the flag turns them on. When the package is missing they are not registered, and the
server says so once in its log; the REST routes need no TensorFlow at all (docs/tfserving.md).
"""

from __future__ import annotations

import logging
from types import ModuleType

from dlscale.frontends.grpc.guard import GuardedServer
from dlscale.frontends.plane import Asked
from dlscale.native import before_tensorflow

log = logging.getLogger("dlscale.grpc")
#: The services registered (their full names), for the log and the tests.
SERVICES = ("tensorflow.serving.PredictionService", "tensorflow.serving.ModelService")
_told = False


def register(server: GuardedServer, plane: Asked, max_elements: int) -> bool:
    """Add TensorFlow Serving's services to `server`; False when the package is not installed."""
    rpcs = services()
    if rpcs is None:
        return False
    rpcs.add_to(server, plane, max_elements)
    log.info("gRPC serves %s", ", ".join(SERVICES))
    return True


def services() -> ModuleType | None:
    """The services' module, TensorFlow loaded after Triton (dlscale/native.py); None, logged
    once, when tensorflow-serving-api is not installed."""
    global _told
    before_tensorflow()
    try:
        from dlscale.frontends.grpc import tfserving_rpcs
    except ImportError as exc:
        if not _told:
            _told = True
            log.warning(
                "TensorFlow Serving's gRPC services are not served: %s (pip install "
                "tensorflow-serving-api; docs/tfserving.md)",
                exc,
            )
        return None
    return tfserving_rpcs
