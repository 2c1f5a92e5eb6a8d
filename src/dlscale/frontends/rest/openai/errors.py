"""OpenAI's error shape: `{"error": {message, type, param, code}}`, with the HTTP status.

vLLM's OpenAI server names the type after the client's exception class and sets `code` to the
status (shared/reference/generative.md); the `openai` client raises the matching class.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import DlscaleError, InvalidInput, NotFound, PermissionDenied

#: The `type` of each status, as the `openai` client's exception classes are named.
_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    408: "RequestTimeoutError",
    409: "ConflictError",
    413: "BadRequestError",
    415: "BadRequestError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    501: "NotImplementedError",
    503: "ServiceUnavailableError",
}


def error_document(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The body of an error answer (also the `data:` of an error in the middle of a stream)."""
    kind = _TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def status_and_document(exc: DlscaleError, model: str = "") -> tuple[int, dict[str, Any]]:
    """The status and body that answer `exc` on an OpenAI route for `model`.

    A restricted OpenAI route answers 401, as a wrong API key does on OpenAI's and vLLM's
    servers; an unknown model gets OpenAI's own sentence, which clients and tools match.
    """
    if isinstance(exc, PermissionDenied):
        return 401, error_document(401, exc.message)
    if isinstance(exc, NotFound) and model:  # no version is asked: only the model is missing
        return 404, error_document(404, f"The model `{model}` does not exist.", "model")
    param = exc.param if isinstance(exc, InvalidInput) else None
    return exc.http_status, error_document(exc.http_status, exc.message, param)
