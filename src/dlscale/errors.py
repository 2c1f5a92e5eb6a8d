"""One error tree for the whole package; each error maps once to an HTTP status and a gRPC code."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from typing import ClassVar

#: An absolute POSIX path not inside a URL or a longer word: '/' and what follows to a delimiter.
_ABSOLUTE = re.compile(r"(?<![\w.~:/\\-])/[^\s'\"`:,;()\[\]{}<>|=]+")
#: How many trailing parts of a host path a client may see: '.../mlp/1/model.onnx'.
_KEPT_PARTS = 3


class DlscaleError(Exception):
    """Base of every error dlscale reports to a user or a client."""

    http_status: ClassVar[int] = 500
    grpc_code: ClassVar[str] = "INTERNAL"
    #: Triton's `nv_inference_request_failure{reason}` label.
    reason: ClassVar[str] = "OTHER"

    @property
    def message(self) -> str:
        """What a client is told: the text with the host's absolute paths cut short."""
        return redact_paths(str(self))


def redact_paths(text: str) -> str:
    """`text` with each absolute path of this host cut to its last parts: '.../mlp/1/model.onnx'.

    A path counts when its first part is a folder of this host (/tmp, /home, /usr, ...), so
    that URL paths a client sent ('/v2/models/x') are left as they were.
    """
    return _ABSOLUTE.sub(_shorten, text)


def _shorten(match: re.Match[str]) -> str:
    path = match.group(0)
    parts = [p for p in path.split("/") if p]
    if not parts or not _host_folder(parts[0]):
        return path
    return ".../" + "/".join(parts[1:][-_KEPT_PARTS:])


@functools.lru_cache(maxsize=256)
def _host_folder(name: str) -> bool:
    return os.path.isdir("/" + name)


def clipped(text: str, most: int) -> str:
    """`text` for a message, cut to `most` characters ('...' last) when a client sent more."""
    return text if len(text) <= most else text[: most - 3] + "..."


class InvalidInput(DlscaleError):
    """The request is malformed or does not match the model (names, datatypes, shapes)."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    reason = "REJECTED"

    def __init__(self, message: str = "", param: str | None = None) -> None:
        super().__init__(message)
        #: The request field at fault, when there is one (OpenAI's error names it in `param`).
        self.param = param


class InvalidField(InvalidInput):
    """A request field with a wrong type or value, named first: `InvalidInput(message, param)`
    said the other way round, for code that checks one field after another."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message, param)

    def __reduce__(self) -> tuple[type[InvalidField], tuple[str, str]]:
        # Pickled between processes (REST workers): both arguments, not Exception's one.
        return type(self), (self.param or "", str(self))


class UnsupportedMediaType(InvalidInput):
    """A body in an encoding or media type the server does not read (RFC 9110: 415)."""

    http_status = 415


class NotFound(DlscaleError):
    """An unknown model, version or resource."""

    http_status = 404
    grpc_code = "NOT_FOUND"
    reason = "REJECTED"


class Unavailable(DlscaleError):
    """The model or server cannot take requests now (not ready, unloading, shutting down)."""

    http_status = 503
    grpc_code = "UNAVAILABLE"
    reason = "REJECTED"


class QueueFull(Unavailable):
    """The model's queue is at max_queue_size: rejected at once rather than queued."""

    grpc_code = "RESOURCE_EXHAUSTED"


class TimedOut(Unavailable):
    """The request's timeout expired while it waited in the queue (Triton answers 503 too)."""

    grpc_code = "DEADLINE_EXCEEDED"


class PermissionDenied(DlscaleError):
    """A restricted API called without the header its restriction asks for."""

    http_status = 403
    grpc_code = "PERMISSION_DENIED"
    reason = "REJECTED"


class Unauthenticated(DlscaleError):
    """A request without the server's API key, or with a wrong one (`--api-key`)."""

    http_status = 401
    grpc_code = "UNAUTHENTICATED"
    reason = "REJECTED"


class TooManyRequests(DlscaleError):
    """A model's own limit refused the request at once: its rate limit or its max in flight.

    429 rather than 503: the server has room, this client (the model's tenants) asked for more
    than its [qos] share. The message names the limit.
    """

    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "REJECTED"


class PayloadTooLarge(DlscaleError):
    """A request body or message above the configured limit."""

    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"
    reason = "REJECTED"


class Unsupported(DlscaleError):
    """A feature the server or this model does not provide."""

    http_status = 501
    grpc_code = "UNIMPLEMENTED"
    reason = "REJECTED"


class BackendError(DlscaleError):
    """The runtime failed while computing a batch; only that batch's requests fail."""

    reason = "BACKEND"


class ConfigError(DlscaleError):
    """A model configuration or repository layout that cannot be used; names file and field."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    reason = "REJECTED"


class BenchError(DlscaleError):
    """A benchmark that cannot run (unreachable target, unknown model, bad settings)."""


class PlanError(DlscaleError):
    """A plan that cannot be made: unknown fabric or device, missing figures, impossible SLO."""

    http_status = 400
    grpc_code = "INVALID_ARGUMENT"
    reason = "REJECTED"


class OptimizeError(DlscaleError):
    """An optimization that cannot run (no data to check accuracy on, a bad tolerance)."""


#: How many known names an error lists (a repository may hold thousands).
LISTED_NAMES = 20


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` most resembles (a misspelling's target), or None."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(name, list(known), n=1)
    return close[0] if close else None


def known_names(name: str, known: Iterable[str], what: str) -> str:
    """' (did you mean 'x'? <what>: a, b, ...)' for an unknown `name`: the closest match, then
    the known names, at most LISTED_NAMES of them (the count of the rest said)."""
    names = sorted(known)
    match = closest(name, names)
    hint = f"did you mean {match!r}? " if match else ""
    shown = ", ".join(repr(n) for n in names[:LISTED_NAMES])
    rest = f", and {len(names) - LISTED_NAMES} more" if len(names) > LISTED_NAMES else ""
    listed = f"{what}: {shown}{rest}" if names else f"no {what}"
    return f" ({hint}{listed})"


def root_cause(error: DlscaleError) -> DlscaleError:
    """The innermost DlscaleError a chain of wrapped errors comes from."""
    while isinstance(error.__cause__, DlscaleError):
        error = error.__cause__
    return error
