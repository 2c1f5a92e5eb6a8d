"""Triton's `pb_utils.TritonError` and its codes, and the errors each code is here.

A response's error reaches the client as Triton answers it (shared/reference/oip.md: not found
404, unavailable 503, unsupported 501, internal 500, the rest 400; over gRPC each code under its
own name), and a BLS call's error reaches the calling model with its code. pb_utils
(triton_python_backend_utils.py) gives user code the names.
"""

from __future__ import annotations

from dlscale.errors import (
    BackendError,
    DlscaleError,
    InvalidInput,
    NotFound,
    Unavailable,
    Unsupported,
)


class TritonError:
    """An error a response carries (Triton's pb_utils.TritonError)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, msg: str, code: int = INTERNAL) -> None:
        self._message = msg
        self._code = code

    def message(self) -> str:
        """The error's text."""
        return self._message

    def code(self) -> int:
        """One of the class's codes."""
        return self._code


class _ModelSaid(DlscaleError):
    """A code with no error of its own here: Triton answers it 400 over HTTP and under its own
    name over gRPC (its http_server.cc and grpc utils)."""

    http_status = 400
    reason = "BACKEND"


class UnknownError(_ModelSaid):
    grpc_code = "UNKNOWN"


class AlreadyExistsError(_ModelSaid):
    grpc_code = "ALREADY_EXISTS"


class CancelledError(_ModelSaid):
    grpc_code = "CANCELLED"
    reason = "CANCELED"  # Triton's nv_inference_request_failure label


#: TritonError codes and the errors they are here, read both ways (the module says how).
ERRORS: dict[int, type[DlscaleError]] = {
    TritonError.INVALID_ARG: InvalidInput,
    TritonError.NOT_FOUND: NotFound,
    TritonError.UNAVAILABLE: Unavailable,
    TritonError.UNSUPPORTED: Unsupported,
    TritonError.UNKNOWN: UnknownError,
    TritonError.ALREADY_EXISTS: AlreadyExistsError,
    TritonError.CANCELLED: CancelledError,
}


def code_of(exc: DlscaleError) -> int:
    """The TritonError code of an error (INTERNAL for any error without a code of its own)."""
    return next((c for c, kind in ERRORS.items() if isinstance(exc, kind)), TritonError.INTERNAL)


def error_of(error: TritonError) -> DlscaleError:
    """The error a response's TritonError is here (a server error for INTERNAL and any code
    without an error of its own)."""
    return ERRORS.get(error.code(), BackendError)(error.message())
