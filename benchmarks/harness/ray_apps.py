"""A plain Ray Serve application as a benchmark's server process: started, announced, stopped.

The Ray Serve peers (the JPEG pipeline, replicas of unequal speed) run in a process of their
own with one cluster each; this is their shared life: start Serve on the port, run the app,
say LISTENING (servers.announce), serve until SIGTERM, then shut Serve and Ray down.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import ray
from ray import serve
from ray.serve.config import HTTPOptions

from benchmarks.harness.servers import HOST, announce

#: No access log, warnings only: per-request logs would cost more than the work measured.
QUIET = {"enable_access_log": False, "log_level": "WARNING"}


def serve_until_stopped(app: Any, name: str, port: int, address: str | None = None) -> None:
    """Run `app` on Ray Serve's HTTP proxy at HOST:port until SIGTERM (a new cluster; "local"
    starts one even where another process's cluster runs on this host)."""
    ray.init(address=address, num_cpus=os.cpu_count(), include_dashboard=False,
             logging_level=logging.WARNING)  # fmt: skip
    serve.start(http_options=HTTPOptions(host=HOST, port=port), logging_config=QUIET)
    serve.run(app, name=name, route_prefix="/")
    announce(port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
