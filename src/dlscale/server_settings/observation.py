"""`dlscale serve`'s logs, request traces and telemetry settings (docs/observability.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlscale.server_settings.fields import setting, unwritable
from dlscale.serving.observe import TRACE_RATE

#: The levels --log-level takes (any case), as Python's logging names them.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

#: Where traces go (Triton's --trace-config mode=...).
TRACE_MODES = ("triton", "opentelemetry")


@dataclass(frozen=True)
class Observation:
    """Logs, request traces and telemetry."""

    log_level: str = setting("INFO", "DEBUG, INFO, WARNING or ERROR", "--log-level")
    #: Where the logs go (stderr when None) and their timestamps: default or ISO8601.
    log_file: Path | None = setting(
        None, "write the logs here instead of stderr", "--log-file", type=Path
    )
    log_format: str = setting(
        "default", "timestamps: default or ISO8601", "--log-format", choices=("default", "ISO8601")
    )
    access_log: bool = setting(
        False, "log every request, one line", "--access-log", action="store_true"
    )
    #: None: tracing cannot be turned on (Triton's --trace-file).
    trace_file: Path | None = setting(
        None, "where request traces go (JSON)", "--trace-file", type=Path
    )
    #: Sampled requests are traced from the start: OFF or TIMESTAMPS, one in `trace_rate`.
    trace_level: str = setting(
        "OFF", "trace sampled requests from the start", "--trace-level",
        choices=("OFF", "TIMESTAMPS"),
    )  # fmt: skip
    trace_rate: int = setting(TRACE_RATE, "trace one in N requests", "--trace-rate", type=int)
    trace_count: int = setting(
        -1, "trace at most N requests, then stop (-1: no limit)", "--trace-count", type=int
    )
    #: Where traced requests go: Triton's JSON file, or OTLP spans (Triton's mode=opentelemetry).
    trace_mode: str = setting(
        "triton", "where traces go: the trace file (triton) or OTLP spans (opentelemetry)",
        "--trace-mode", choices=TRACE_MODES,
    )  # fmt: skip
    #: An OTLP collector, over HTTP (or gRPC: grpc://) (vLLM's flag; Triton's --trace-config
    #: opentelemetry,url=URL): traced requests go there as spans (docs/observability.md).
    otlp_traces_endpoint: str | None = setting(
        None, "send traces as OTLP spans to this collector (host:port or URL)",
        "--otlp-traces-endpoint",
    )  # fmt: skip
    telemetry_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.trace_mode == "opentelemetry" and not self.otlp_traces_endpoint:
            raise ValueError(
                "trace mode opentelemetry needs a collector: --otlp-traces-endpoint URL (or "
                "--trace-config opentelemetry,url=URL)"
            )
        if self.trace_level not in ("OFF", "TIMESTAMPS"):
            raise ValueError(f"trace level {self.trace_level!r}: expected OFF or TIMESTAMPS")
        if self.trace_rate < 1 or self.trace_count < -1:
            raise ValueError("--trace-rate must be >= 1 and --trace-count >= -1")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(
                f"--log-level {self.log_level}: expected one of {', '.join(LOG_LEVELS)}"
            )
        for flag, path in (("--log-file", self.log_file), ("--trace-file", self.trace_file)):
            # Checked at start: the log is opened then, and the first traced request would fail.
            if path is not None and (why := unwritable(path)):
                raise ValueError(f"{flag} {path}: {why}")
