"""Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate`, `/generate_stream`.

The body is one JSON object (bounded by max_body_bytes like every body): a key, at the top or
inside `parameters`, that names a model input becomes that tensor (a scalar or a 1-D list);
every other key becomes a request parameter (a list or an object travels as its JSON text, as
`stop: ["\\n"]` does). `/generate` answers one JSON document; `/generate_stream` answers
server-sent events, `data: {json}\\n\\n` per response, ending when the model's last response is
sent (no `[DONE]`); an error before the first response is the usual status and `{"error"}`, one
after it a last event `data: {"error": ...}` (shared/reference/generative.md).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import orjson

from dlscale.errors import DlscaleError, InvalidInput, PayloadTooLarge
from dlscale.frontends.limits import Limits
from dlscale.frontends.plane import Asked
from dlscale.frontends.rest.documents import json_object
from dlscale.frontends.rest.responses import EVENT_STREAM, RestResponse, event, json_response
from dlscale.serving.observe.logs import log_failure
from dlscale.serving.observe.otel import TRACEPARENT
from dlscale.serving.streams import aclose
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    ModelConfigView,
    Parameters,
    TensorSpec,
)
from dlscale.wire.bounds import check_id
from dlscale.wire.tensors import Buffer

#: Keys of the body that are neither inputs nor parameters.
_OWN_KEYS = ("id", "parameters")


class GenerateApi:
    """The generate routes over one Plane (the REST API routes to these two handlers)."""

    def __init__(self, plane: Asked, limits: Limits) -> None:
        self.plane = plane
        self.limits = limits

    async def generate(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """One answer: a generative model's stream joined, or any model's one answer."""
        request = await self._request(args, headers, body)
        return json_response(document(await self.plane.infer(request)))

    async def generate_stream(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> RestResponse:
        """Server-sent events, one per response; the first awaited before the status is sent,
        so that a request refused (unknown model, bad input, a model that does not stream)
        gets its 4xx."""
        request = await self._request(args, headers, body)
        responses = self.plane.stream(request)
        try:
            first = await anext(responses, None)
        except BaseException:
            await aclose(responses)
            raise
        events = _events(first, responses, request.model_name)
        return RestResponse(200, [], EVENT_STREAM, stream=events)

    async def _request(
        self, args: list[str], headers: Mapping[str, str], body: Buffer
    ) -> InferenceRequest:
        model, version = args
        doc = json_object(body, "generate")
        config = await self.plane.model_config(model, version)
        request = decode(doc, config, version, self.limits.max_tensor_elements)
        request.traceparent = headers.get(TRACEPARENT, "")
        return request


def decode(
    doc: dict[str, Any], config: ModelConfigView, version: str, max_elements: int
) -> InferenceRequest:
    """The InferenceRequest a generate body asks for (see the module's docstring)."""
    nested = doc.get("parameters", {})
    if not isinstance(nested, dict):
        raise InvalidInput("field 'parameters' of a generate request must be a JSON object")
    ident = doc.get("id", "")
    if not isinstance(ident, str):
        raise InvalidInput(f"field 'id' must be a string, got {ident!r}")
    check_id(ident)
    specs = {s.name: s for s in config.inputs}
    fields = {**nested, **{k: v for k, v in doc.items() if k not in _OWN_KEYS}}
    inputs: dict[str, np.ndarray] = {}
    parameters: Parameters = {}
    for key, value in fields.items():
        if key in specs:
            inputs[key] = _tensor(specs[key], value, config.max_batch_size > 0, max_elements)
        else:
            parameters[key] = _parameter(key, value)
    return InferenceRequest(config.name, inputs, version, ident, None, parameters)


def _tensor(spec: TensorSpec, value: Any, batched: bool, max_elements: int) -> np.ndarray:
    """A scalar or 1-D list as the input `spec`, with a batch of one when the model batches."""
    values = value if isinstance(value, list) else [value]
    if len(values) > max_elements:
        raise PayloadTooLarge(
            f"input {spec.name!r} has {len(values)} elements, above the limit of {max_elements}"
        )
    if any(isinstance(v, list | dict) or v is None for v in values):
        raise InvalidInput(f"input {spec.name!r}: give a scalar or a flat list of values")
    array = _array(spec, values)
    dims = list(spec.shape)
    fixed = all(d >= 0 for d in dims)
    shape = tuple(dims) if fixed and math.prod(dims) == len(values) else (len(values),)
    if len(shape) != len(dims):
        raise InvalidInput(
            f"input {spec.name!r} has shape {dims}; generate takes it as a scalar or a 1-D list"
        )
    array = array.reshape(shape)
    return array[np.newaxis] if batched else array


def _array(spec: TensorSpec, values: list[Any]) -> np.ndarray:
    name, kind = spec.name, spec.datatype
    if kind is Datatype.BYTES:
        if not all(isinstance(v, str) for v in values):
            raise InvalidInput(f"input {name!r} is BYTES: give strings")
        return np.array([v.encode() for v in values], dtype=object)
    if kind is Datatype.BOOL:
        if not all(isinstance(v, bool) for v in values):
            raise InvalidInput(f"input {name!r} is BOOL: give true or false")
        return np.array(values, dtype=np.bool_)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise InvalidInput(f"input {name!r} is {kind.value}: give numbers")
    try:
        return np.array(values, dtype=kind.numpy)
    except (OverflowError, ValueError) as exc:
        raise InvalidInput(f"input {name!r}: {exc}") from None


def _parameter(key: str, value: Any) -> bool | int | float | str:
    """A request parameter: the protocol's kinds as they are (an integer within 64 bits, as
    the protocol carries it), a list or object as its JSON."""
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise InvalidInput(f"parameter {key!r}: {value} is beyond a 64-bit integer")
    if isinstance(value, bool | int | float | str):
        return value
    if value is None:
        raise InvalidInput(f"parameter {key!r} may not be null")
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson refuses what JSON can say but the protocol cannot: big integers
        raise InvalidInput(f"parameter {key!r} holds an integer beyond 64 bits") from None


def document(response: InferenceResponse) -> dict[str, Any]:
    """A generate response: id, model, version, each output by name (one element: a scalar),
    each response parameter."""
    doc: dict[str, Any] = {
        "id": response.id,
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    for name, array in response.outputs.items():
        flat = [_plain(v) for v in np.asarray(array).reshape(-1)]
        doc[name] = flat[0] if len(flat) == 1 else flat
    doc.update(response.parameters)
    return doc


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value.item() if isinstance(value, np.generic) else value


async def _events(
    first: InferenceResponse | None, responses: AsyncIterator[InferenceResponse], model: str
) -> AsyncIterator[bytes]:
    """Each response as one event; a final response with no outputs sends none."""
    try:
        response = first
        while response is not None:
            if response.outputs or not response.final:
                yield event(document(response))
            response = await anext(responses, None)
    except DlscaleError as exc:
        log_failure("HTTP", model, exc.http_status, exc.reason, f"generate_stream: {exc}")
        yield event({"error": exc.message})
    finally:
        await aclose(responses)
