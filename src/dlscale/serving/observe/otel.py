"""OTLP traces: a sampled request as OpenTelemetry spans, sent by the SDK's batch processor.

A traced request opens its span when it arrives (so that the pipeline steps and model calls it
makes are its children, through a context variable) and closes it when answered; its phases
are written then as child spans with the times the statistics are taken from (RequestTimes):
`queue`, `batch formation` (merging the batch), `compute` (attribute `batch_size`),
`batch split`, and for generative requests `prefill` and `decode`. A caller's W3C
`traceparent` is continued. Which requests are traced is the Tracer's choice (trace.py:
`trace_rate`, `trace_count`); a request's steps and calls are traced with it.

The exporter never holds the event loop: a span ends into the SDK's BatchSpanProcessor, a queue
of at most QUEUE_SIZE spans that one thread of the SDK sends; when the collector is down or slow
the queue fills and further spans are dropped (memory stays bounded), requests are not slowed.
Needs the `[otel]` extra (opentelemetry-sdk and its OTLP exporters, HTTP and gRPC).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlscale.errors import ConfigError
from dlscale.serving.observe.stats import RequestTimes

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span

log = logging.getLogger(__name__)

#: The W3C trace-context header (REST) and metadata key (gRPC) a caller's trace comes in.
TRACEPARENT = "traceparent"
#: Spans waiting for the exporter at most; more are dropped while the collector lags.
QUEUE_SIZE = 2048
#: Spans in one export at most (the SDK's default).
EXPORT_BATCH = 512
#: How often the exporter sends what waits, milliseconds (the SDK's default).
SCHEDULE_MS = 5000
#: How long one export may take before it is given up, milliseconds.
EXPORT_TIMEOUT_MS = 10_000
#: At shutdown, how long the spans still waiting may take to go; then they are dropped (a
#: collector that is down must not hold the server's stop).
SHUTDOWN_S = 2.0
#: The SDK's logger that warns once per span dropped on a full queue.
_SDK_QUEUE_LOGGER = "opentelemetry.sdk._shared_internal"
#: The span of the request being served in this task (its steps and calls are its children).
CURRENT: contextvars.ContextVar[Span | None] = contextvars.ContextVar("dlscale_span", default=None)


@dataclass(frozen=True)
class TokenTimes:
    """When a generative request's first and last tokens came (perf_counter ns; 0: none)."""

    first: int = 0
    last: int = 0


class OtlpSink:
    """The SDK's tracer with a bounded batch processor, sending to one OTLP endpoint."""

    def __init__(
        self, endpoint: str, queue_size: int = QUEUE_SIZE, exporter: SpanExporter | None = None
    ) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:  # pragma: no cover - the extra is in dev
            raise ConfigError(
                "OTLP traces need the [otel] extra: pip install 'dlscale[otel]'"
            ) from exc
        self.endpoint = traces_url(endpoint)
        if exporter is None:
            exporter = _exporter(self.endpoint)
        self.provider = TracerProvider(resource=Resource.create({"service.name": "dlscale"}))
        self.processor = BatchSpanProcessor(
            exporter,
            max_queue_size=queue_size,
            max_export_batch_size=min(EXPORT_BATCH, queue_size),
            schedule_delay_millis=SCHEDULE_MS,
            export_timeout_millis=EXPORT_TIMEOUT_MS,
        )
        self.provider.add_span_processor(self.processor)
        self._exporter = exporter
        self.tracer = self.provider.get_tracer("dlscale")
        #: Spans dropped on a full queue (the collector down or slow); warned of once.
        self.drops = _DropCounter()
        logging.getLogger(_SDK_QUEUE_LOGGER).addFilter(self.drops)
        # perf_counter (the request times) to the epoch nanoseconds that spans carry.
        self._epoch = time.time_ns() - time.perf_counter_ns()

    def begin(self, name: str, attributes: dict[str, Any], traceparent: str, start: int) -> Span:
        """Open a request's span: a child of the request this task serves, else of the
        caller's `traceparent` (W3C), else a new trace."""
        from opentelemetry.trace import set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = CURRENT.get()
        if parent is not None:
            context = set_span_in_context(parent)
        elif traceparent:
            context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        else:
            context = None
        return self.tracer.start_span(
            name, context, attributes=attributes, start_time=self._epoch + start
        )

    def end(self, span: Span, times: RequestTimes, tokens: TokenTimes | None, ok: bool) -> None:
        """Write the request's phases as children of its span, then close it."""
        from opentelemetry.trace import StatusCode, set_span_in_context

        context = set_span_in_context(span)
        for name, start, stop, attributes in _phases(times, tokens):
            child = self.tracer.start_span(
                name, context, attributes=attributes, start_time=self._epoch + start
            )
            child.end(self._epoch + stop)
        if not ok:
            span.set_status(StatusCode.ERROR)
        span.end(self._epoch + (times.request_end or time.perf_counter_ns()))

    def queued(self) -> int:
        """Spans waiting for the exporter now (at most the queue's size)."""
        inner = getattr(self.processor, "_batch_processor", None)
        return len(getattr(inner, "_queue", ()))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Send what waits now (tests, shutdown); False when it could not within the time."""
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self, wait_s: float = SHUTDOWN_S) -> None:
        """Send what waits, for at most `wait_s`, and stop the exporter's thread."""
        stop = threading.Thread(
            target=self.provider.shutdown, name="dlscale-otlp-stop", daemon=True
        )
        stop.start()
        stop.join(wait_s)
        if stop.is_alive():  # the collector does not answer: its retries are cut short
            log.warning("the OTLP collector at %s did not take the last spans", self.endpoint)
            self._exporter.shutdown()
        logging.getLogger(_SDK_QUEUE_LOGGER).removeFilter(self.drops)


class _DropCounter(logging.Filter):
    """Counts the SDK's "queue full" warnings (one per span dropped) and lets the first through:
    a collector that is down must not flood the log, one line per request."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Queue full"):
            return True
        self.count += 1
        return self.count == 1


def _phases(
    times: RequestTimes, tokens: TokenTimes | None
) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(name, start, end, attributes) of each phase the request reached."""
    t = times
    rows = {"batch_size": t.batch_rows} if t.batch_rows else {}
    phases: list[tuple[str, int, int, dict[str, Any]]] = [
        ("queue", t.queue_start, t.compute_start, {})
    ]
    if tokens is not None:  # a generative sequence: no batch of ours, the engine's steps
        if tokens.first:
            phases.append(("prefill", t.compute_start, tokens.first, {}))
            phases.append(("decode", tokens.first, tokens.last or tokens.first, {}))
    else:
        phases += [
            ("batch formation", t.compute_start, t.compute_input_end, rows),
            ("compute", t.compute_input_end, t.compute_output_start, rows),
            ("batch split", t.compute_output_start, t.compute_end, rows),
        ]
    return [(n, a, b, attrs) for n, a, b, attrs in phases if a and b >= a]


def traces_url(endpoint: str) -> str:
    """Where spans go: `grpc://host:port` (OTLP over gRPC, plain text) as given; otherwise
    OTLP over HTTP, where `host:port` or a base URL gets `/v1/traces` (as
    OTEL_EXPORTER_OTLP_ENDPOINT does) and a URL with a path is kept."""
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    scheme, _, rest = url.partition("://")
    if scheme not in ("http", "https", "grpc"):
        raise ConfigError(
            f"OTLP traces endpoint {endpoint!r}: expected http://, https:// (OTLP over HTTP, "
            "a collector's port 4318) or grpc:// (OTLP over gRPC, port 4317)"
        )
    host, slash, path = rest.partition("/")
    if not host:
        raise ConfigError(f"OTLP traces endpoint {endpoint!r} has no host")
    if scheme == "grpc":
        return f"grpc://{host}"
    return url if slash and path else f"{scheme}://{host}/v1/traces"


def _exporter(url: str) -> SpanExporter:
    """The SDK's OTLP exporter for `url` (traces_url's form)."""
    timeout = EXPORT_TIMEOUT_MS / 1000
    if url.startswith("grpc://"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=url.removeprefix("grpc://"), insecure=True, timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=url, timeout=timeout)
