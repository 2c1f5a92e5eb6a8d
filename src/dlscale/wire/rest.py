"""The Open Inference Protocol's REST body: a JSON header, then binary tensors, both ways.

The server decodes requests and encodes responses; the bench's client encodes requests and
decodes responses. Both directions share one reader and one writer of the layout (the binary
tensor data extension): a tensor with `binary_data_size` takes that many bytes of the body after
the JSON header, in the order the header lists the tensors. A tensor placed in a shared-memory
region (`shared_memory_region` in its parameters) carries no data in the body at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import numpy as np
import orjson

from dlscale.errors import InvalidInput
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    RegionRef,
    RegionTensor,
    RequestedOutput,
    TensorSpec,
)
from dlscale.wire.bounds import MAX_ELEMENTS, check_id, check_shape
from dlscale.wire.regions import REGION, REGION_KEYS, region_of, region_parameters
from dlscale.wire.rest_json import (
    REQUEST_DOC,
    RESPONSE_DOC,
    AnswerTensorDoc,
    OutputDoc,
    ParameterValue,
    TensorDoc,
    decode_json,
)
from dlscale.wire.tensors import (
    Buffer,
    Form,
    JsonData,
    RawData,
    WireTensor,
    Wording,
    parse_datatype,
    read_raw,
    read_tensor,
    write_raw,
    write_tensor,
)

_Doc = TypeVar("_Doc")
#: Bound once: on Python 3.11 reading a member through its enum class costs a Python call.
_JSON = Form.JSON

#: How REST words binary data that does not fit its tensor.
REST_WORDS = Wording(
    size=(
        "{role} {name!r} of shape {shape} and datatype {datatype} takes {want} bytes, but {got} "
        "were sent"
    ),
    overrun="BYTES {role} {name!r}: element {index} claims {size} bytes, but only {left} remain",
    short=(
        "BYTES {role} {name!r}: its shape holds {count} elements, but the binary data ({got} bytes "
        "of 4-byte lengths and values) holds {found}"
    ),
    trailing=(
        "BYTES {role} {name!r}: its shape holds {count} elements, but the binary data ({got} "
        "bytes of 4-byte lengths and values) holds {count} and {extra} bytes more"
    ),
)


# Made for every request: slots and no frozen __setattr__ (nothing changes them once made).
@dataclass(slots=True)
class OutputFormat:
    """How the client wants outputs sent: each one in JSON or as binary data."""

    all_binary: bool = False
    binary: frozenset[str] = frozenset()

    def is_binary(self, name: str) -> bool:
        """Whether output `name` goes as binary data after the JSON header."""
        return self.all_binary or name in self.binary


@dataclass(slots=True)
class Body:
    """A body as parts to write in order; `header_length` is set when binary data follows."""

    parts: list[Buffer]
    header_length: int | None


# -- the server's side: requests in, responses out -------------------------------------------------


def decode_request(
    body: Buffer,
    header_length: int | None,
    model: str,
    version: str = "",
    max_elements: int = MAX_ELEMENTS,
) -> tuple[InferenceRequest, OutputFormat]:
    """Decode a request body; `header_length` is Inference-Header-Content-Length, if given.

    No tensor may declare more than `max_elements` elements, nor more than its data carries.
    """
    view = memoryview(body)
    doc, json_end = _header(REQUEST_DOC, view, header_length, "request")
    params = doc.parameters  # the decoder's own dict, made for this request: no copy
    inputs, in_regions = _read_tensors(
        doc.inputs, view, json_end, header_length is not None, "request", None, max_elements
    )
    check_id(doc.id)
    outputs, fmt = _requested_outputs(doc.outputs, params)
    # In field order, no keywords: a call with keywords builds a dict per request.
    request = InferenceRequest(model, inputs, version, doc.id, outputs, params, in_regions)
    return request, fmt


def decode_raw_request(
    body: Buffer,
    spec: TensorSpec,
    batched: bool,
    model: str,
    version: str = "",
    max_elements: int = MAX_ELEMENTS,
) -> tuple[InferenceRequest, OutputFormat]:
    """Decode the raw binary form (Inference-Header-Content-Length: 0) of a single-input model.

    The body is the input's bytes for a batch of 1; every output is sent back as binary.
    """
    view = memoryview(body)
    shape = list(spec.shape)
    if batched and shape:
        shape[0] = 1
    shape = _fill_unknown_dim(spec, shape, len(view))
    tensor = WireTensor("input", spec.name, spec.datatype, tuple(shape))
    array = read_tensor(tensor, RawData(view, REST_WORDS), max_elements)
    request = InferenceRequest(
        model_name=model, model_version=version, inputs={spec.name: array}, parameters={}
    )
    return request, OutputFormat(all_binary=True)


def encode_response(response: InferenceResponse, fmt: OutputFormat) -> Body:
    """Encode a response: a JSON header, then the binary outputs in the order the header lists."""
    outputs, binaries = _write_tensors(response.outputs, fmt.is_binary, "output")
    doc: dict[str, Any] = {"model_name": response.model_name}
    if response.model_version:
        doc["model_version"] = response.model_version
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = (
        outputs + _region_entries(response.in_regions) if response.in_regions else outputs
    )
    return _body(doc, binaries)


# -- the client's side: requests out, responses in -------------------------------------------------


def encode_request(request: InferenceRequest, binary: bool) -> Body:
    """Encode a request: every input binary (outputs asked for binary too) or every one JSON."""
    inputs, binaries = _write_tensors(request.inputs, lambda _: binary, "input")
    inputs += _region_entries(request.in_regions)
    doc: dict[str, Any] = {}
    if request.id:
        doc["id"] = request.id
    params = dict(request.parameters)
    if binary:
        params["binary_data_output"] = True
    if params:
        doc["parameters"] = params
    doc["inputs"] = inputs
    if request.outputs is not None:
        doc["outputs"] = [
            {"name": o.name, "parameters": _output_parameters(o)} for o in request.outputs
        ]
    return _body(doc, binaries)


def decode_response(
    payload: Buffer, header_length: int | None, placed: Mapping[str, RegionRef] | None = None
) -> InferenceResponse:
    """Decode a response body with the server's reader of the layout.

    `placed` names the outputs the request asked into regions: an answer that gives such an
    output no data (Triton adds no parameters to them either) reads as that region.
    """
    view = memoryview(payload)
    doc, json_end = _header(RESPONSE_DOC, view, header_length, "response")
    outputs, in_regions = _read_tensors(
        doc.outputs, view, json_end, header_length is not None, "response", placed or {}
    )
    return InferenceResponse(
        model_name=doc.model_name,
        outputs=outputs,
        model_version=doc.model_version,
        id=doc.id,
        parameters=dict(doc.parameters or {}),
        in_regions=in_regions,
    )


# -- the layout, both ways -------------------------------------------------------------------------


def _header(
    decoder: msgspec.json.Decoder[_Doc], view: memoryview, header_length: int | None, what: str
) -> tuple[_Doc, int]:
    json_end = len(view) if header_length is None else header_length
    if json_end > len(view):
        raise InvalidInput(
            f"Inference-Header-Content-Length is {json_end}, but the body has only "
            f"{len(view)} bytes"
        )
    if json_end == 0:
        raise InvalidInput(f"the {what} body is empty: expected a JSON inference {what}")
    return decode_json(decoder, view[:json_end], f"inference {what}"), json_end


def _read_tensors(
    tensors: list[TensorDoc] | list[AnswerTensorDoc],
    body: memoryview,
    offset: int,
    has_binary: bool,
    what: str,
    placed: Mapping[str, RegionRef] | None = None,
    max_elements: int = MAX_ELEMENTS,
) -> tuple[dict[str, np.ndarray], dict[str, RegionTensor]]:
    role = "input" if what == "request" else "output"
    arrays: dict[str, np.ndarray] = {}
    in_regions: dict[str, RegionTensor] = {}
    for tensor in tensors:
        if tensor.name in arrays or tensor.name in in_regions:
            raise InvalidInput(f"{role} {tensor.name!r} appears twice in the {what}")
        read, offset = _read_tensor(tensor, body, offset, has_binary, what, placed, max_elements)
        if isinstance(read, RegionTensor):
            in_regions[tensor.name] = read
        else:
            arrays[tensor.name] = read
    if offset != len(body):
        raise InvalidInput(
            f"the body has {len(body) - offset} bytes after the JSON header and the binary "
            f"tensors; the {role}s' binary_data_size values do not add up to the body length"
        )
    return arrays, in_regions


def _read_tensor(
    entry: TensorDoc | AnswerTensorDoc,
    body: memoryview,
    offset: int,
    has_binary: bool,
    what: str,
    placed: Mapping[str, RegionRef] | None,
    max_elements: int = MAX_ELEMENTS,
) -> tuple[np.ndarray | RegionTensor, int]:
    role = "input" if what == "request" else "output"
    name = entry.name
    params = entry.parameters or {}
    tensor = WireTensor(
        role, name, parse_datatype(role, name, entry.datatype), tuple(entry.shape), params
    )
    size = params.get("binary_data_size")
    # Most tensors name no region: one set test instead of the call (every tensor, every request)
    ref = None if params.keys().isdisjoint(REGION_KEYS) else region_of(role, name, params)
    if ref is None and placed and name in placed and size is None and entry.data is None:
        ref = placed[name]
    if ref is not None:
        if size is not None or entry.data is not None:
            raise InvalidInput(
                f"{role} {name!r} gives {REGION!r} and data too: give one of 'data', "
                f"'binary_data_size' or {REGION!r}"
            )
        check_shape(role, name, tensor.shape, max_elements)
        return RegionTensor(tensor.datatype, tensor.shape, ref), offset
    if size is None:
        return read_tensor(tensor, JsonData(entry.data), max_elements), offset
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(
            f"{role} {name!r}: binary_data_size must be a non-negative integer, got {size!r}"
        )
    if not has_binary:
        raise InvalidInput(
            f"{role} {name!r} gives binary_data_size, but the {what} has no "
            "Inference-Header-Content-Length header to say where the JSON ends"
        )
    if entry.data is not None:
        raise InvalidInput(f"{role} {name!r} gives both data and binary_data_size")
    if offset + size > len(body):
        raise InvalidInput(
            f"{role} {name!r} has binary_data_size {size}, but only {len(body) - offset} "
            "bytes of the body remain"
        )
    chunk = body[offset : offset + size]
    return read_raw(tensor, chunk, REST_WORDS, max_elements), offset + size


def _write_tensors(
    arrays: Mapping[str, np.ndarray], binary: Callable[[str], bool], role: str
) -> tuple[list[dict[str, Any]], list[Buffer]]:
    entries: list[dict[str, Any]] = []
    binaries: list[Buffer] = []
    for name, array in arrays.items():
        datatype = Datatype.from_numpy(array.dtype)
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype,  # orjson writes a StrEnum member as its value
            "shape": array.shape,  # orjson writes a tuple as an array: no list per tensor
        }
        # FP16 and BF16 cannot travel as JSON numbers: they go binary whatever was asked.
        if binary(name) or not datatype.json_safe:
            raw = write_raw(array, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            binaries.append(raw)
        else:
            entry["data"] = write_tensor(role, name, array, datatype, _JSON).values
        entries.append(entry)
    return entries, binaries


def _region_entries(in_regions: Mapping[str, RegionTensor]) -> list[dict[str, Any]]:
    """Tensors placed in regions: shape, datatype and the region, and no data."""
    return [
        {
            "name": name,
            "datatype": placed.datatype.value,
            "shape": list(placed.shape),
            "parameters": region_parameters(placed.ref),
        }
        for name, placed in in_regions.items()
    ]


def _output_parameters(output: RequestedOutput) -> dict[str, Any]:
    if output.region is None:
        return dict(output.parameters)
    # Written into a region, the output has no binary form to ask for.
    params = {k: v for k, v in output.parameters.items() if k != "binary_data"}
    return params | region_parameters(output.region)


def _body(doc: dict[str, Any], binaries: list[Buffer]) -> Body:
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not binaries:
        return Body([header], None)
    return Body([header, *binaries], len(header))


# -- the server's request details ------------------------------------------------------------------


def _requested_outputs(
    outputs: list[OutputDoc] | None, params: dict[str, ParameterValue]
) -> tuple[list[RequestedOutput] | None, OutputFormat]:
    # A true-or-false flag is read in place; `_flag` is called only to refuse another value.
    flag = params.get("binary_data_output", False)
    all_binary = (
        flag if flag is False or flag is True else _flag(params, "binary_data_output", None)
    )
    if outputs is None:
        return None, OutputFormat(all_binary, _NONE)
    wanted, binary = [], []
    for out in outputs:
        name, params = out.name, out.parameters
        flag = params.get("binary_data", False)
        is_binary = flag if flag is False or flag is True else _flag(params, "binary_data", name)
        region = None
        if not params.keys().isdisjoint(REGION_KEYS):
            region = region_of("output", name, params)
        if region is not None and is_binary:
            raise InvalidInput(
                f"output {name!r} asks for both {REGION!r} and 'binary_data': an output "
                "written into a region carries no data"
            )
        wanted.append(RequestedOutput(name, is_binary, params, region))  # the decoder's own
        if is_binary:
            binary.append(name)
    return wanted, OutputFormat(all_binary, frozenset(binary))


_NONE: frozenset[str] = frozenset()


def _flag(params: dict[str, ParameterValue], key: str, output: str | None) -> bool:
    """A true-or-false parameter of the request (`output` None) or of one output it asks for."""
    value = params.get(key, False)
    if value is False or value is True:
        return value
    where = "request" if output is None else f"output {output!r}"  # made only when refused
    raise InvalidInput(f"parameter {key!r} of the {where} must be true or false, got {value!r}")


def _fill_unknown_dim(spec: TensorSpec, shape: list[int], size: int) -> list[int]:
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if spec.datatype is Datatype.BYTES:
        if unknown:
            raise InvalidInput(
                f"input {spec.name!r} has variable dims {list(spec.shape)}: the raw binary form "
                "(Inference-Header-Content-Length: 0) needs a JSON header to give its shape"
            )
        return shape
    if len(unknown) > 1:
        raise InvalidInput(
            f"input {spec.name!r} has shape {list(spec.shape)} with several variable dims: the raw "
            "binary form (Inference-Header-Content-Length: 0) cannot tell its shape; send a JSON "
            "header"
        )
    if unknown:
        known = math.prod(d for d in shape if d != -1) * spec.datatype.itemsize
        if known == 0 or size % known:
            raise InvalidInput(
                f"raw body of {size} bytes does not fit input {spec.name!r} of shape "
                f"{list(spec.shape)} and datatype {spec.datatype.value}"
            )
        shape[unknown[0]] = size // known
    return shape
