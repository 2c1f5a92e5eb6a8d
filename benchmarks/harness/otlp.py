"""An OTLP/HTTP receiver for the trace benchmarks: `POST /v1/traces` on a free port in a thread
of this process, answering each export at once and counting the spans it carried."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from benchmarks.harness.servers import HOST


@dataclass
class Received:
    """What the receiver took so far: exports and the spans in them."""

    port: int = 0
    exports: int = 0
    spans: int = 0

    @property
    def endpoint(self) -> str:
        """The URL to give `dlscale serve --otlp-traces-endpoint`."""
        return f"http://{HOST}:{self.port}"


@contextmanager
def otlp_receiver() -> Iterator[Received]:
    """A receiver listening until the block ends."""
    received = Received()
    lock = threading.Lock()
    answer = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            request = ExportTraceServiceRequest.FromString(body)
            spans = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            with lock:
                received.exports += 1
                received.spans += spans
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((HOST, 0), Handler)
    server.daemon_threads = True
    received.port = int(server.server_address[1])
    threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True).start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
