"""Triton's flags: those of another form than dlscale's, and those dlscale lacks.

Triton's spellings of dlscale's own flags are aliases on the settings' fields; these take a
value of another form, or name a flag dlscale lacks (docs/configuration.md, "From Triton").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlscale.server_settings import boolean


class _Translate(argparse.Action):
    """A Triton flag whose value becomes a dlscale field's (`--log-verbose 1`: DEBUG)."""

    def __init__(self, *args: Any, translate: Callable[[str], Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.translate = translate

    def __call__(self, parser: Any, namespace: Any, value: Any, option: str | None = None) -> None:
        try:
            changed = self.translate("true" if value is None else str(value))
        except (ValueError, argparse.ArgumentTypeError):
            parser.error(f"argument {option}: invalid value {value!r}")
        if changed is not None:
            setattr(namespace, self.dest, changed)


class _Refuse(argparse.Action):
    """A Triton flag dlscale has no flag for: an error naming what to use instead."""

    def __init__(self, *args: Any, advice: str, **kwargs: Any) -> None:
        kwargs.update(nargs="?", help=argparse.SUPPRESS)
        super().__init__(*args, **kwargs)
        self.advice = advice

    def __call__(self, parser: Any, namespace: Any, value: Any, option: str | None = None) -> None:
        parser.error(f"{option} is Triton's flag, which dlscale does not have: {self.advice}")


class _AcceptFalse(_Refuse):
    """A Triton flag whose `false` is what dlscale always does (accepted, nothing to set);
    its `true` asks for what dlscale does not do (refused, with the advice)."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: str | None = None) -> None:
        try:
            asked = boolean("true" if value is None else str(value))
        except (ValueError, argparse.ArgumentTypeError):
            parser.error(f"argument {option}: invalid value {value!r} (expected true or false)")
        if asked:
            parser.error(f"{option}=true is not offered by dlscale: {self.advice}")


def _verbose(text: str) -> str:
    return "DEBUG" if int(text) > 0 else "INFO"


def _off_when_false(text: str) -> int | None:
    return None if boolean(text) else -1  # -1: the port's "off"; true keeps --*-port's value


#: Triton flag -> (dlscale field it sets, how its value becomes the field's flag value).
TRITON_TRANSLATED: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "--log-verbose": ("log_level", _verbose, "N: N > 0 logs at DEBUG (as --log-level DEBUG)"),
    "--allow-http": ("http_port", _off_when_false, "BOOL: false turns REST off (--http-port -1)"),
    "--allow-grpc": ("grpc_port", _off_when_false, "BOOL: false turns gRPC off (--grpc-port -1)"),
    "--allow-metrics": (
        "metrics_port", _off_when_false, "BOOL: false turns metrics off (--metrics-port -1)",
    ),
}  # fmt: skip

_TLS = "--tls-cert, --tls-key and --tls-client-ca (TLS for REST and gRPC together)"
_ADDRESS = "--host (one address for REST, gRPC and metrics)"
#: Triton flags whose `false` is dlscale's behaviour -> why their `true` is refused.
TRITON_FALSE_ONLY: dict[str, str] = {
    "--strict-model-config": (
        "configs are always completed from the model file (ONNX signatures, a Python model's "
        "auto_complete_config); `dlscale models check` shows the completed configs"
    ),
}

#: Triton flags dlscale lacks -> what to use instead (or why there is nothing to set).
TRITON_REFUSED: dict[str, str] = {
    "--http-address": _ADDRESS,
    "--grpc-address": _ADDRESS,
    "--metrics-address": _ADDRESS,
    "--grpc-use-ssl": _TLS,
    "--grpc-use-ssl-mutual": _TLS,
    "--grpc-server-cert": _TLS,
    "--grpc-server-key": _TLS,
    "--grpc-root-cert": _TLS,
    "--log-info": "--log-level (INFO, WARNING or ERROR)",
    "--log-warning": "--log-level (INFO, WARNING or ERROR)",
    "--log-error": "--log-level (INFO, WARNING or ERROR)",
    "--http-thread-count": "--http-workers N (REST in N processes; each one is an event loop)",
    "--rate-limit": "a [qos] table in each model's config.toml (docs/qos.md)",
    "--backend-config": "the parameters of each model's config.toml or config.pbtxt",
    "--backend-directory": "none: runtimes are Python packages (dlscale.backends)",
    "--disable-auto-complete-config": "none: configs are completed from the model",
    "--model-load-thread-count": "none: models load in parallel, each off the event loop",
    "--pinned-memory-pool-byte-size": "none: buffers are page-locked as needed on a CUDA host",
    "--cuda-memory-pool-byte-size": "none: each runtime owns its device memory",
    "--cache-config": "--cache-size BYTES (dlscale's cache is Triton's local cache)",
    "--allow-gpu-metrics": "none: GPU telemetry is on the metrics port (--metrics-port -1: off)",
    "--allow-cpu-metrics": "none: CPU telemetry is on the metrics port (--metrics-port -1: off)",
    "--metrics-interval-ms": "none: telemetry is read every second",
    "--allow-sagemaker": "none: dlscale serves the Open Inference Protocol and OpenAI's API",
    "--allow-vertex-ai": "none: dlscale serves the Open Inference Protocol and OpenAI's API",
    "--id": "none: the server's name is dlscale",
}


#: Triton's --trace-config keys -> the dlscale field each sets (a `mode,` prefix names the
#: mode a key belongs to: `triton,file=F`, `opentelemetry,url=U`).
TRACE_CONFIG = {
    "mode": "trace_mode",
    "level": "trace_level",
    "rate": "trace_rate",
    "count": "trace_count",
    "triton,file": "trace_file",
    "file": "trace_file",
    "opentelemetry,url": "otlp_traces_endpoint",
}
_TRACE_VALUES: dict[str, Callable[[str], Any]] = {
    "trace_rate": int,
    "trace_count": int,
    "trace_file": Path,
    "trace_level": str.upper,
    "trace_mode": str.lower,
}


class _TraceConfig(argparse.Action):
    """Triton's `--trace-config [MODE,]KEY=VALUE`, repeated: each sets one dlscale field."""

    def __call__(self, parser: Any, namespace: Any, value: Any, option: str | None = None) -> None:
        key, equals, text = str(value).partition("=")
        field = TRACE_CONFIG.get(key.strip().lower()) if equals else None
        if field is None:
            parser.error(
                f"argument {option}: {value!r} is not a setting dlscale reads; it reads "
                f"{', '.join(k + '=...' for k in TRACE_CONFIG)} (docs/observability.md)"
            )
            return
        try:
            setattr(namespace, field, _TRACE_VALUES.get(field, str)(text.strip()))
        except ValueError:
            parser.error(f"argument {option}: invalid value {value!r}")


def add_triton_flags(serve: argparse.ArgumentParser) -> None:
    """Triton's flags whose values differ in form from dlscale's, and those dlscale lacks."""
    group = serve.add_argument_group("Triton's flags of another form (docs/configuration.md)")
    for flag, (dest, translate, text) in TRITON_TRANSLATED.items():
        metavar = text.split(":")[0]
        group.add_argument(
            flag, dest=dest, action=_Translate, translate=translate, nargs="?", help=text,
            metavar=metavar,
        )  # fmt: skip
    group.add_argument(
        "--trace-config", action=_TraceConfig, metavar="[MODE,]KEY=VALUE",
        help="Triton's trace settings: mode=triton|opentelemetry, level=, rate=, count=, "
        "triton,file=PATH, opentelemetry,url=URL (repeat the flag)",
    )  # fmt: skip
    for table, action in ((TRITON_FALSE_ONLY, _AcceptFalse), (TRITON_REFUSED, _Refuse)):
        for flag, advice in table.items():
            serve.add_argument(flag, dest=f"triton_{flag[2:]}", action=action, advice=advice)
