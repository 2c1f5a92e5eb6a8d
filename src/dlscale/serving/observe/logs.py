"""Logging: the server's handler, Triton's logging extension over it, and the request logs.

`dlscale` loggers log at INFO (DEBUG with a verbose level of 1 or more); every other library
logs warnings only, so that DEBUG shows dlscale's own steps without drowning them (a verbose
level of 2 lets the libraries' DEBUG through too). The logging extension turns INFO, WARNING
and ERROR lines on and off, sets the verbose level and the format at run time; the log file is
chosen at start (`--log-file`), as Triton requires.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlscale.errors import InvalidInput

FORMATS = {
    "default": ("%(asctime)s %(levelname)s %(name)s: %(message)s", None),
    "ISO8601": ("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z"),
}
#: The settings that turn a level's lines on and off, under Triton's names.
SWITCHES = {"log_info": logging.INFO, "log_warning": logging.WARNING, "log_error": logging.ERROR}
#: The highest verbose level (gRPC carries it as a uint32).
MAX_VERBOSE = 2**32 - 1
#: One line per failed request: protocol, model, status and reason.
requests = logging.getLogger("dlscale.requests")
#: One line per request when the access log is on (`--access-log`).
access = logging.getLogger("dlscale.access")


class LogControl:
    """The log settings of Triton's logging extension, applied to Python's logging."""

    def __init__(self, log_file: Path | None = None, log_format: str = "default") -> None:
        self.log_file = log_file
        self.log_format = _format(log_format)
        self.enabled = dict.fromkeys(SWITCHES.values(), True)
        self.verbose = 0
        self._handler: logging.Handler | None = None
        #: The levels `install` changes, as they were before (`uninstall` puts them back).
        self._levels: list[tuple[logging.Logger, int]] = []

    def install(self, level: str = "INFO", access_log: bool = False) -> None:
        """Send the server's logs to the log file or stderr, with the settings of `--log-level`."""
        self._handler = (
            logging.FileHandler(self.log_file)
            if self.log_file
            else logging.StreamHandler(sys.stderr)
        )
        self._handler.addFilter(self._keep)
        root = logging.getLogger()
        self._levels = [(x, x.level) for x in (root, logging.getLogger("dlscale"), access)]
        root.addHandler(self._handler)
        access.setLevel(logging.INFO if access_log else logging.WARNING)
        name = level.upper()
        self.update({
            "log_verbose_level": 1 if name == "DEBUG" else 0,
            "log_info": name in ("DEBUG", "INFO"),
            "log_warning": name in ("DEBUG", "INFO", "WARNING"),
        })  # fmt: skip

    def uninstall(self) -> None:
        """Remove the handler `install` added."""
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
            for logger, level in self._levels:
                logger.setLevel(level)

    def settings(self) -> dict[str, str | bool | int]:
        """The settings now, under Triton's names."""
        return {
            "log_file": str(self.log_file or ""),
            **{key: self.enabled[level] for key, level in SWITCHES.items()},
            "log_verbose_level": self.verbose,
            "log_format": self.log_format,
        }

    def update(self, changes: Mapping[str, Any]) -> dict[str, str | bool | int]:
        """Apply the settings given (None leaves one as it is) and answer them all."""
        known = set(self.settings())
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InvalidInput(f"unknown log settings {unknown}: expected some of {sorted(known)}")
        given = {k: v for k, v in changes.items() if v is not None}
        if "log_file" in given:
            raise InvalidInput(  # a client asking to move a file: 400, not 501
                "the log file cannot be changed through the protocol: start the server with "
                "--log-file PATH"
            )
        for key, level in SWITCHES.items():
            if key in given:
                self.enabled[level] = _bool(key, given[key])
        if "log_verbose_level" in given:
            self.verbose = _level(given["log_verbose_level"])
        if "log_format" in given:
            self.log_format = _format(given["log_format"])
        self._apply()
        return self.settings()

    def _apply(self) -> None:
        logging.getLogger("dlscale").setLevel(logging.DEBUG if self.verbose else logging.INFO)
        if self._handler is None:
            return  # embedded: the process's logging belongs to its owner
        # Other libraries: warnings only, unless the verbose level asks for their details.
        logging.getLogger().setLevel(logging.DEBUG if self.verbose >= 2 else logging.WARNING)
        fmt, datefmt = FORMATS[self.log_format]
        self._handler.setFormatter(logging.Formatter(fmt, datefmt))

    def _keep(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return self.verbose > 0
        level = min((lv for lv in self.enabled if lv >= record.levelno), default=logging.ERROR)
        return self.enabled[level]


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"log setting {key!r} must be true or false, got {value!r}")
    return value


def _level(value: Any) -> int:
    # The bound is the protocol's (a uint32 over gRPC); beyond it JSON could not answer it.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_VERBOSE:
        shown = value if not isinstance(value, int) or value.bit_length() < 64 else "too large"
        raise InvalidInput(
            f"log setting 'log_verbose_level' must be an integer from 0 to {MAX_VERBOSE}, "
            f"got {shown!r}"
        )
    return value


def _format(value: Any) -> str:
    if not isinstance(value, str) or value not in FORMATS:  # a list is unhashable
        raise InvalidInput(
            f"log setting 'log_format' must be one of {list(FORMATS)}, got {value!r}"
        )
    return str(value)


def log_failure(protocol: str, model: str, status: int | str, reason: str, message: str) -> None:
    """One line for a failed request; a server-side failure is a warning, a client's is info."""
    server_side = status in ("INTERNAL", "UNAVAILABLE", "UNKNOWN") or (
        isinstance(status, int) and status >= 500
    )
    requests.log(
        logging.WARNING if server_side else logging.INFO,
        "%s request failed: model=%s status=%s reason=%s: %s",
        protocol,
        model or "-",
        status,
        reason,
        message,
    )
