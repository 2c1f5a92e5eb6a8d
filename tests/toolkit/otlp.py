"""Real OTLP receivers for the tests, on 127.0.0.1 port 0: over HTTP (`POST /v1/traces`, each
body an ExportTraceServiceRequest) and over gRPC (the collector's TraceService); both decode
the spans with opentelemetry-proto."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector got it: ids in hex, times in epoch nanoseconds."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict[str, Any]
    error: bool


class Receiver:
    """The spans received so far, in arrival order (read under its lock)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The URL a server is given (`--otlp-traces-endpoint`)."""
        return f"http://127.0.0.1:{self.port}"

    def take(self, body: bytes) -> None:
        self.take_request(ExportTraceServiceRequest.FromString(body))

    def take_request(self, request: ExportTraceServiceRequest) -> None:
        got = [
            _span(span)
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]
        with self.lock:
            self.spans.extend(got)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace received so far."""
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def clear(self) -> None:
        with self.lock:
            self.spans.clear()


def _span(span: Any) -> ReceivedSpan:
    attributes = {a.key: _value(a.value) for a in span.attributes}
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        start=span.start_time_unix_nano,
        end=span.end_time_unix_nano,
        attributes=attributes,
        error=span.status.code == 2,  # STATUS_CODE_ERROR
    )


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver listening until the block ends."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = self.rfile.read(length)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> Any:
        self.receiver.take_request(request)
        return ExportTraceServiceResponse()


@contextmanager
def receiving_grpc() -> Iterator[Receiver]:
    """A gRPC collector (OTLP's TraceService) listening until the block ends; its `endpoint`
    is `grpc://127.0.0.1:PORT`."""
    receiver = GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(receiver), server)
    receiver.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver
    finally:
        server.stop(grace=None)


class GrpcReceiver(Receiver):
    """A Receiver reached over gRPC."""

    @property
    def endpoint(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"
