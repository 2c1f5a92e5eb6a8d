"""Small request documents of the REST routes: JSON object bodies, load parameters, the binary
extension's header length; each bounded by the body it comes in (max_body_bytes)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from dlscale.errors import InvalidInput
from dlscale.wire.rest import ANY_JSON, decode_json
from dlscale.wire.tensors import Buffer

HEADER_LENGTH = "inference-header-content-length"


def header_length(headers: Mapping[str, str]) -> int | None:
    raw = headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidInput(
            f"Inference-Header-Content-Length must be a non-negative integer, got {raw!r}"
        )
    return value


def load_request(body: Buffer) -> dict[str, str | bytes]:
    """A load request's parameters; the files in them travel base64-encoded over REST."""
    params = json_object(body, "load").get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput("field 'parameters' of the load request must be an object")
    out: dict[str, str | bytes] = {}
    for key, value in params.items():
        if not key.startswith("file:"):
            out[key] = value
            continue
        if not isinstance(value, str):
            raise InvalidInput(f"load parameter {key!r} must be a base64 string")
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:  # ValueError: characters beyond ASCII
            raise InvalidInput(f"load parameter {key!r} is not valid base64: {exc}") from None
    return out


def json_object(body: Buffer, what: str) -> dict[str, Any]:
    """An optional JSON object body (empty means `{}`)."""
    if not len(body):
        return {}
    doc = decode_json(ANY_JSON, body, f"{what} request")
    if not isinstance(doc, dict):
        raise InvalidInput(f"the {what} request must be a JSON object")
    return doc
