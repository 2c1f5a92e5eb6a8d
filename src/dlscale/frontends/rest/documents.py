"""Small request documents of the REST routes: JSON object bodies, load parameters, the binary
extension's header length; each bounded by the body it comes in (max_body_bytes)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from dlscale.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from dlscale.wire.rest_json import ANY_JSON, decode_json, from_base64
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


#: The binary answer's header by JSON length: a model's answers repeat a few lengths, so each
#: is made once (no str and tuples per answer); the framing keeps its line, made once too.
_LENGTH_HEADERS: dict[int, tuple[tuple[str, str], ...]] = {}
_MOST_LENGTHS = 4096


def length_header(length: int) -> tuple[tuple[str, str], ...]:
    """The binary answer's Inference-Header-Content-Length header, for a JSON of `length`."""
    header = _LENGTH_HEADERS.get(length)
    if header is None:
        header = (("Inference-Header-Content-Length", str(length)),)
        if len(_LENGTH_HEADERS) < _MOST_LENGTHS:
            _LENGTH_HEADERS[length] = header
    return header


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
        out[key] = from_base64(value, f"load parameter {key!r}")
    return out


def json_object(body: Buffer, what: str) -> dict[str, Any]:
    """An optional JSON object body (empty means `{}`)."""
    if not len(body):
        return {}
    doc = decode_json(ANY_JSON, body, f"{what} request")
    if not isinstance(doc, dict):
        raise InvalidInput(f"the {what} request must be a JSON object")
    return doc


def decoded_body(headers: Mapping[str, str], body: Buffer, max_bytes: int) -> Buffer:
    """The body with any Content-Encoding undone, held to `max_bytes` once inflated."""
    encoding = headers.get("content-encoding")
    if encoding is None:  # most requests
        return body
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r}: expected gzip, deflate or none")
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidInput(f"the {encoding} body cannot be decompressed: {exc}") from None
    if len(out) > max_bytes:
        raise PayloadTooLarge(f"the decompressed body exceeds the limit of {max_bytes} bytes")
    return out
