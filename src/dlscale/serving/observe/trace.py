"""Triton's trace extension: sampled requests' timestamps, written to a JSON file.

Settings (`trace_level`, `trace_rate`, `trace_count`, `log_frequency`, `trace_file`) hold
server-wide and may be overridden per model; a model's unset settings follow the server's. The
file is chosen when the server starts (`--trace-file`); like Triton, the protocol may not move
it. Each trace is Triton's pair of JSON objects: `{id, model_name, model_version, request_id}`
and `{id, timestamps: [{name, ns}, ...]}` with REQUEST_START, QUEUE_START, COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END and REQUEST_END.

Memory and the event loop stay bounded whatever the settings (issue 28): at most
MAX_BUFFERED_TRACES wait in memory (more go to an indexed file, as log_frequency would), files
are written by one worker thread, and while MAX_PENDING_WRITES wait for it further traces are
dropped (counted in `dropped`, logged once). With an OTLP sink (Triton's `--trace-config
mode=opentelemetry`, vLLM's `--otlp-traces-endpoint`) the sampled requests go out as spans
instead (otel.py); the settings sample them the same way. Disk stays bounded too (issue 33:
`log_frequency 1` wrote a file per request): the indexed files `<trace_file>.N` take at most
MAX_TRACE_FILES indexes, reused in turn, so the newest traces overwrite the oldest file.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError, InvalidInput
from dlscale.serving.observe import TRACE_RATE
from dlscale.serving.observe.otel import CURRENT, OtlpSink, TokenTimes
from dlscale.serving.observe.stats import RequestTimes

log = logging.getLogger(__name__)

#: The settings of the protocol, as Triton names them, and what each holds.
NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file")
_LIMITS = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}  # smallest value allowed
#: Each setting's TraceSettings field: its name less `trace_` (the file is not one of them).
_FIELD = {name: name.removeprefix("trace_") for name in NAMES if name != "trace_file"}
#: The largest value of a numeric setting (Triton's are uint32; beyond, JSON cannot carry it).
MAX_SETTING = 2**32 - 1
#: Traces kept in memory before they are written out, whatever log_frequency says.
MAX_BUFFERED_TRACES = 10_000
#: Indexed trace files kept (`<trace_file>.0` .. `.{MAX_TRACE_FILES - 1}`), reused in turn.
MAX_TRACE_FILES = 64
#: Files waiting for the writer thread; beyond it, traces are dropped rather than queued.
MAX_PENDING_WRITES = 8
_STAMPS = tuple(f.name for f in dataclasses.fields(RequestTimes) if f.name != "batch_rows")


@dataclass(frozen=True)
class TraceSettings:
    """One scope's settings: the level is OFF or TIMESTAMPS; count -1 means no limit."""

    level: str = "OFF"
    rate: int = TRACE_RATE
    count: int = -1
    log_frequency: int = 0


@dataclass
class Trace:
    """A request being traced: its id and what it is (and its span, when traced by OTLP)."""

    id: int
    model: str
    version: int
    request_id: str
    span: Any = None
    #: The context variable's token that made `span` current for the request's own calls.
    token: contextvars.Token[Any] | None = None


class Tracer:
    """Samples requests per the settings of their model and writes their timestamps."""

    def __init__(
        self,
        trace_file: Path | None = None,
        settings: TraceSettings | None = None,
        otlp: OtlpSink | None = None,
    ):
        if settings is not None and settings.level != "OFF" and trace_file is None and not otlp:
            raise ConfigError(
                f"trace level {settings.level} needs a trace file (--trace-file) or an OTLP "
                "endpoint (--otlp-traces-endpoint)"
            )
        self.trace_file = trace_file
        #: Where traced requests go as spans, instead of the file (None: the file, Triton's).
        self.otlp = otlp
        self._global = settings or TraceSettings()
        self._models: dict[str, dict[str, Any]] = {}  # per-model overrides, by setting
        #: Whether no request can be traced now (no OTLP sink, and no trace file or every
        #: level OFF): the DataPlane reads this one attribute per request instead of calling
        #: `start`. Kept by `update`, the one place the settings change.
        self.off = self._nothing_traced()
        self._seen: dict[str, int] = {}  # requests seen per scope, for the sampling rate
        self._left: dict[str, int] = {}  # traces still to take per scope (trace_count)
        self._buffer: list[dict[str, Any]] = []
        self._next_id = 1
        self._file_index = 0
        self._writer: ThreadPoolExecutor | None = None
        self._pending: set[Future[None]] = set()
        self._pending_lock = threading.Lock()
        #: Traces dropped because the writer fell behind.
        self.dropped = 0

    # -- settings ----------------------------------------------------------------------------

    def settings(self, model: str = "") -> dict[str, str | list[str]]:
        """The settings in force for a model (or server-wide), in the protocol's string form."""
        s = self._effective(model)
        left = self._left.get(model if model in self._models else "", s.count)
        return {
            "trace_level": [s.level],
            "trace_rate": str(s.rate),
            "trace_count": str(left),
            "log_frequency": str(s.log_frequency),
            "trace_file": str(self.trace_file or ""),
            "trace_mode": "opentelemetry" if self.otlp else "triton",
        }

    def update(self, changes: Mapping[str, Any], model: str = "") -> dict[str, str | list[str]]:
        """Change the settings given (None clears a model's own value); answer the result."""
        parsed = {name: _parse(name, value) for name, value in changes.items()}
        if "trace_file" in parsed:
            raise InvalidInput(  # a client asking to move a file: 400, not 501
                "the trace file cannot be changed through the protocol: start the server with "
                "--trace-file PATH"
            )
        if parsed.get("trace_level", "OFF") != "OFF" and self.trace_file is None and not self.otlp:
            raise InvalidInput(
                "tracing needs a trace file or an OTLP endpoint: start the server with "
                "--trace-file or --otlp-traces-endpoint"
            )
        if model:
            own = self._models.setdefault(model, {})
            for name, value in parsed.items():
                if value is None:
                    own.pop(name, None)
                else:
                    own[name] = value
        else:
            fields = {_FIELD[n]: v for n, v in parsed.items() if v is not None}
            self._global = dataclasses.replace(self._global, **fields)
        if "trace_count" in parsed:
            self._left.pop(model, None)
        self.off = self._nothing_traced()
        return self.settings(model)

    def _nothing_traced(self) -> bool:
        return self.otlp is None and (
            self.trace_file is None or (not self._models and self._global.level == "OFF")
        )

    def _effective(self, model: str) -> TraceSettings:
        own = self._models.get(model)
        if not own:
            return self._global
        return dataclasses.replace(self._global, **{_FIELD[n]: v for n, v in own.items()})

    # -- tracing ------------------------------------------------------------------------------

    def start(
        self,
        model: str,
        version: int,
        request_id: str,
        traceparent: str = "",
        kind: str = "",
        nests: bool = True,
    ) -> Trace | None:
        """A trace for this request when its scope samples it, else None (the common case).

        With OTLP, a request made while a traced one is served (its pipeline step, its model
        call: `kind`) is traced too, as a child span; `traceparent` is the caller's W3C header;
        `nests`: the calls this task makes next are the request's (not a stream's iteration).
        """
        if self.otlp is not None:
            return self._start_span(model, version, request_id, traceparent, kind, nests)
        # Without a sink `off` says whether any scope could sample (`_nothing_traced`).
        return None if self.off else self._sample(model, version, request_id)

    def _start_span(
        self, model: str, version: int, request_id: str, traceparent: str, kind: str, nests: bool
    ) -> Trace | None:
        assert self.otlp is not None
        nested = CURRENT.get() is not None
        trace = self._sample(model, version, request_id) if not nested else None
        if trace is None and not nested:
            return None
        if trace is None:
            trace = Trace(0, model, version, request_id)
        attributes: dict[str, Any] = {"model": model, "model_version": version}
        if request_id:
            attributes["request_id"] = request_id
        name = kind if nested and kind else "request"
        trace.span = self.otlp.begin(name, attributes, traceparent, time.perf_counter_ns())
        if nests:
            trace.token = CURRENT.set(trace.span)
        return trace

    def _sample(self, model: str, version: int, request_id: str) -> Trace | None:
        if not self._models and self._global.level == "OFF":
            return None
        settings = self._effective(model)
        if settings.level == "OFF":
            return None
        scope = model if model in self._models else ""
        seen = self._seen[scope] = self._seen.get(scope, 0) + 1
        left = self._left.setdefault(scope, settings.count)
        if left == 0 or seen % settings.rate:
            return None
        if left > 0:
            self._left[scope] = left - 1
        trace = Trace(self._next_id, model, version, request_id)
        self._next_id += 1
        return trace

    def finish(
        self,
        trace: Trace,
        times: RequestTimes,
        tokens: TokenTimes | None = None,
        ok: bool = True,
    ) -> None:
        """Record a traced request's timestamps; write them out when the settings say so (or
        end its span; `tokens`: a generative request's, `ok`: whether it was answered)."""
        if trace.span is not None:
            assert self.otlp is not None
            if trace.token is not None:
                with contextlib.suppress(ValueError):  # ended in another context (a stream)
                    CURRENT.reset(trace.token)
            self.otlp.end(trace.span, times, tokens, ok)
            return
        header = {"id": trace.id, "model_name": trace.model, "model_version": trace.version}
        if trace.request_id:
            header["request_id"] = trace.request_id
        stamps = [
            {"name": name.upper(), "ns": getattr(times, name)}
            for name in _STAMPS
            if getattr(times, name)  # a request that failed early never reached some steps
        ]
        self._buffer += [header, {"id": trace.id, "timestamps": stamps}]
        settings = self._effective(trace.model)
        scope = trace.model if trace.model in self._models else ""
        traces = len(self._buffer) // 2
        if (
            (settings.log_frequency and traces >= settings.log_frequency)
            or self._left.get(scope) == 0
            or traces >= MAX_BUFFERED_TRACES
        ):
            self._write(indexed=True)

    def flush(self) -> None:
        """Write what is collected (at shutdown): to the trace file itself unless indexed files
        were written already. Waits for the writer thread (and the OTLP exporter's)."""
        if self.otlp is not None:
            self.otlp.shutdown()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._buffer:
            path = self._path(indexed=self._file_index > 0)
            if path is not None:
                _dump(path, self._buffer)
            self._buffer = []

    def wait(self) -> None:
        """Block until the files handed to the writer thread are written (tests, shutdown)."""
        with self._pending_lock:
            pending = list(self._pending)
        for future in pending:
            future.result()

    def _path(self, indexed: bool) -> Path | None:
        if self.trace_file is None:
            return None
        if not indexed:
            return self.trace_file
        index = self._file_index % MAX_TRACE_FILES  # the oldest file goes: disk stays bounded
        path = self.trace_file.with_name(f"{self.trace_file.name}.{index}")
        self._file_index += 1
        return path

    def _write(self, indexed: bool) -> None:
        """Hand the buffer to the writer thread (the event loop never touches the disk)."""
        buffer, self._buffer = self._buffer, []
        with self._pending_lock:
            if len(self._pending) >= MAX_PENDING_WRITES:
                if not self.dropped:
                    log.warning("trace files are written slower than traces come: dropping")
                self.dropped += len(buffer) // 2
                return
        path = self._path(indexed)
        if path is None:
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="dlscale-trace")
        future = self._writer.submit(_dump, path, buffer)
        with self._pending_lock:
            self._pending.add(future)
        future.add_done_callback(self._written)

    def _written(self, future: Future[None]) -> None:
        with self._pending_lock:
            self._pending.discard(future)


def _dump(path: Path, traces: list[dict[str, Any]]) -> None:
    try:
        path.write_text(json.dumps(traces, indent=1))
    except OSError as exc:
        log.error("cannot write traces to %s: %s", path, exc)


def _parse(name: str, value: Any) -> Any:
    """A setting from its protocol form (strings, a list for the level; None to clear)."""
    if name not in NAMES:
        raise InvalidInput(f"unknown trace setting {name!r}: expected one of {list(NAMES)}")
    if value is None or name == "trace_file":
        return value
    if isinstance(value, list) and name != "trace_level":
        value = value[0] if len(value) == 1 else value
    if name == "trace_level":
        return _level(value)
    try:
        number = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not _LIMITS[name] <= number <= MAX_SETTING:
        shown = repr(value) if number is None or number.bit_length() < 64 else "more"
        raise InvalidInput(
            f"trace setting {name!r} must be an integer >= {_LIMITS[name]} (at most "
            f"{MAX_SETTING}), got {shown}"
        )
    return number


def _level(value: Any) -> str:
    levels = value if isinstance(value, list) else [value]
    if levels == ["OFF"] or levels == ["TIMESTAMPS"]:
        return str(levels[0])
    if "TENSORS" in levels:
        raise InvalidInput("trace level TENSORS is not supported: dlscale traces TIMESTAMPS")
    raise InvalidInput(f"trace_level must be ['OFF'] or ['TIMESTAMPS'], got {value!r}")
