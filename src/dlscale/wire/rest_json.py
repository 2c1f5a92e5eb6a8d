"""The REST body's JSON document: its schema (msgspec structs) and the one reader of JSON text.

`wire/rest.py` lays tensors out around this document; the routes read their small JSON bodies
with `decode_json` and `ANY_JSON`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, TypeVar

import msgspec

from dlscale.errors import InvalidInput
from dlscale.wire.tensors import Buffer

ParameterValue = bool | int | float | str
_Doc = TypeVar("_Doc")


class TensorDoc(msgspec.Struct):
    """One tensor of a request, as its JSON header gives it."""

    name: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    datatype: str
    parameters: dict[str, ParameterValue] = {}
    data: Any = None


class OutputDoc(msgspec.Struct):
    """One output a request asks for."""

    name: str
    parameters: dict[str, ParameterValue] = {}


class RequestDoc(msgspec.Struct):
    """An inference request's JSON header."""

    inputs: list[TensorDoc]
    id: str = ""
    parameters: dict[str, ParameterValue] = {}
    outputs: list[OutputDoc] | None = None


class AnswerTensorDoc(msgspec.Struct):
    """One output tensor of a response, as its JSON header gives it."""

    # Other servers put more than the protocol's scalars in parameters (MLServer: content types).
    name: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = None


class ResponseDoc(msgspec.Struct):
    """An inference response's JSON header (ours or another server's)."""

    outputs: list[AnswerTensorDoc]
    model_name: str = ""
    model_version: str = ""
    id: str = ""
    parameters: dict[str, Any] | None = None


#: Reads a request's JSON header.
REQUEST_DOC = msgspec.json.Decoder(RequestDoc)
#: Any JSON value (the repository requests' small bodies).
ANY_JSON: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
#: Reads a response's JSON header.
RESPONSE_DOC = msgspec.json.Decoder(ResponseDoc)


def decode_json(decoder: msgspec.json.Decoder[_Doc], text: Buffer, what: str) -> _Doc:
    """JSON through a msgspec decoder; any malformed text is InvalidInput naming `what`.

    msgspec raises UnicodeDecodeError for invalid UTF-8 inside strings and RecursionError for
    nesting deeper than the interpreter allows: both are the client's mistake.
    """
    try:
        return decoder.decode(text)
    except msgspec.ValidationError as exc:  # a DecodeError too: the JSON is well formed
        raise InvalidInput(f"invalid {what}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"malformed JSON in the {what}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"malformed JSON in the {what}: invalid UTF-8 at byte {exc.start} of a string"
        ) from None
    except RecursionError:
        raise InvalidInput(f"malformed JSON in the {what}: nested too deeply") from None


def from_base64(text: str, what: str) -> bytes:
    """`text` decoded, or a 400 naming `what`: characters beyond ASCII too (a ValueError, which
    would otherwise reach the client as a server error)."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{what} is not valid base64: {exc}") from None
