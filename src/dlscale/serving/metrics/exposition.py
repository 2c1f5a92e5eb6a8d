"""The metrics port: Prometheus' text format (0.0.4), counters under Triton's exact names.

prometheus_client's exposition renames every counter `<name>_total`; dashboards built for Triton
query `nv_inference_request_success` and its siblings, which Triton exports as counters without
the suffix. This writer keeps each sample's name and types the family as it is typed.

The server may hand the port a guard (`--api-key` in scope all): a scrape without the key is
answered 401, as the REST routes answer it; Prometheus sends the key with `authorization:
{credentials: KEY}` in its scrape config (docs/limits.md).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.registry import Collector

from dlscale.errors import DlscaleError

#: Checks a scrape's headers (lower-case names); raises a DlscaleError to refuse it.
Guard = Callable[[Mapping[str, str]], None]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: OpenMetrics types that the 0.0.4 text format calls otherwise.
_TYPES = {"unknown": "untyped", "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram"}


def render(registry: Collector) -> bytes:
    """Every family the registry collects, in the text format; sample names as they are."""
    out: list[str] = []
    for family in registry.collect():
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        name = family.name
        if family.type == "counter" and any(s.name == name + "_total" for s in family.samples):
            # prometheus_client's own counters sample NAME_total: the text format types that
            # name (Triton's counters are collected under their bare names and stay so).
            name += "_total"
        out.append(f"# HELP {name} {doc}\n")
        out.append(f"# TYPE {name} {_TYPES.get(family.type, family.type)}\n")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # OpenMetrics-only series
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
            shown = f"{{{labels}}}" if labels else ""
            out.append(f"{sample.name}{shown} {_number(sample.value)}\n")
    return "".join(out).encode()


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class MetricsServer:
    """`GET /metrics` (any path, as prometheus_client answers) on its own thread."""

    def __init__(
        self, registry: Collector, host: str, port: int, guard: Guard | None = None
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    if guard is not None:
                        guard({k.lower(): v for k, v in self.headers.items()})
                except DlscaleError as exc:
                    text = exc.message.encode() + b"\n"
                    bearer = ("WWW-Authenticate", "Bearer")
                    self._answer(exc.http_status, "text/plain; charset=utf-8", text, bearer)
                    return
                self._answer(200, CONTENT_TYPE, render(registry))

            def _answer(self, status: int, kind: str, body: bytes, *extra: tuple[str, str]) -> None:
                self.send_response(status)
                headers = (("Content-Type", kind), *extra, ("Content-Length", str(len(body))))
                for name, value in headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # a scrape every few seconds is not news

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="dlscale-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        """The port really bound."""
        return int(self._server.server_address[1])

    def start(self) -> None:
        """Serve scrapes in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the port."""
        self._server.shutdown()
        self._server.server_close()
