"""ModelInfer messages ⇄ dlscale.types, both ways: the server's and the clients' one converter.

Tensors travel either all as typed `contents` or all as raw contents (one little-endian blob per
tensor, in order), never both in one message. The server decodes requests and encodes responses;
the bench's clients encode requests and decode responses with the same readers and writers.
A tensor placed in a shared-memory region carries no contents: a request gives raw contents only
for the other inputs (as tritonclient sends them), a response an empty blob for it (as Triton
answers, so that clients may index raw contents by output position).

Raw contents stay out of protobuf on the way in and out (`Framed`, wire/protowire.py): received
messages are split into a small header parsed by protobuf and views of the raw blobs; sent ones
are the header's bytes and the arrays' own memory, joined once by `serialize`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput, PayloadTooLarge
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RegionRef,
    RegionTensor,
    RequestedOutput,
)
from dlscale.wire.bounds import MAX_ELEMENTS, check_id, check_shape
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb
from dlscale.wire.protowire import embedded, field_parts, nbytes, split_field
from dlscale.wire.regions import REGION, region_of, region_parameters
from dlscale.wire.tensors import (
    Buffer,
    Form,
    TypedValues,
    WireTensor,
    Wording,
    parse_datatype,
    read_raw_checked,
    read_tensor,
    write_raw,
    write_tensor,
)

#: The typed-contents field of each datatype, and the numpy type protobuf hands it back as.
TYPED_FIELDS: dict[Datatype, tuple[str, np.dtype[Any]]] = {
    Datatype.BOOL: ("bool_contents", np.dtype(np.bool_)),
    Datatype.INT8: ("int_contents", np.dtype(np.int32)),
    Datatype.INT16: ("int_contents", np.dtype(np.int32)),
    Datatype.INT32: ("int_contents", np.dtype(np.int32)),
    Datatype.INT64: ("int64_contents", np.dtype(np.int64)),
    Datatype.UINT8: ("uint_contents", np.dtype(np.uint32)),
    Datatype.UINT16: ("uint_contents", np.dtype(np.uint32)),
    Datatype.UINT32: ("uint_contents", np.dtype(np.uint32)),
    Datatype.UINT64: ("uint64_contents", np.dtype(np.uint64)),
    Datatype.FP32: ("fp32_contents", np.dtype(np.float32)),
    Datatype.FP64: ("fp64_contents", np.dtype(np.float64)),
    Datatype.BYTES: ("bytes_contents", np.dtype(object)),
}
#: Bound once: on Python 3.11 an enum member read through its class (`Form.RAW`) and a
#: member's `.value` are Python-level calls, each paid per tensor of every answer.
_RAW, _TYPED = Form.RAW, Form.TYPED
_NAMES = {d: d.value for d in Datatype}

#: How gRPC words raw contents that do not fit their tensor.
GRPC_WORDS = Wording(
    size="{role} {name!r}: its raw contents hold {got} bytes, but shape {shape} of {datatype} "
    "needs {want}",
    overrun="{role} {name!r}: BYTES element {index} declares {size} bytes, but only {left} remain "
    "in its raw contents",
    short="{role} {name!r}: its BYTES raw contents end after {found} of {count} elements",
    trailing="{role} {name!r}: {extra} bytes remain in its BYTES raw contents after the {count} "
    "elements its shape holds",
)
_INT64_MAX = 2**63 - 1
#: Field numbers of the raw contents, and of a stream answer's ModelInferResponse.
RAW_INPUT_FIELD, RAW_OUTPUT_FIELD, STREAM_RESPONSE_FIELD = 7, 6, 2
#: Messages smaller than this are parsed whole by protobuf: its copies cost less than a split.
SPLIT_FROM_BYTES = 64 * 1024


@dataclass(slots=True)
class Framed:
    """A ModelInfer message whose raw contents travel beside it, not inside.

    `message` has no raw contents; `raw` holds them in order: views of the received bytes, or
    the memory of the arrays to send.
    """

    message: Any
    raw: list[Buffer]

    def whole(self, field: int) -> Any:
        """The message with its raw contents copied in (for tools and tests; copies each blob)."""
        getattr(self.message, _RAW_NAMES[field]).extend(bytes(b) for b in self.raw)
        self.raw = []
        return self.message


_RAW_NAMES = {RAW_INPUT_FIELD: "raw_input_contents", RAW_OUTPUT_FIELD: "raw_output_contents"}
#: What a tensor without typed contents reads as (never changed: read only).
_NO_CONTENTS = pb.InferTensorContents()


def read_framed(data: bytes, kind: Any, field: int) -> Framed:
    """A received ModelInferRequest (`field` 7) or ModelInferResponse (6), raw contents as views.

    Raises protobuf's DecodeError for bytes that are not such a message, as `FromString` does.
    """
    if len(data) < SPLIT_FROM_BYTES:
        message = kind.FromString(data)
        raw = getattr(message, _RAW_NAMES[field])
        return Framed(message, list(raw) if raw else [])
    rest, views = split_field(data, field)
    return Framed(kind.FromString(rest), list(views))


def serialize(framed: Framed, field: int, stream: bool = False) -> bytes:
    """The message's bytes with its raw contents as field `field`: one copy of each blob.

    `stream` wraps a ModelInferResponse as a ModelStreamInferResponse's answer.
    """
    parts: list[Buffer] = [framed.message.SerializeToString()]
    parts += field_parts(field, framed.raw)
    if stream:
        parts = embedded(STREAM_RESPONSE_FIELD, parts)
    return b"".join(parts)


# -- parameters ------------------------------------------------------------------------------------


def parameters(params: Mapping[str, Any], what: str = "parameter") -> Parameters:
    """A protobuf parameter map as plain values (uint64 and int64 both become int); `what`
    names a parameter in the error when one has no value."""
    out: Parameters = {}
    if not params:  # the common case; iterating even an empty upb map costs microseconds
        return out
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidInput(f"{what} {key!r} has no value")
        out[key] = getattr(value, which)
    return out


def _set_parameters(target: Any, params: Parameters) -> None:
    for key, value in params.items():
        slot = target[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int) and value > _INT64_MAX:
            slot.uint64_param = value
        elif isinstance(value, int):
            slot.int64_param = value
        elif isinstance(value, float):
            slot.double_param = value
        else:
            slot.string_param = value


# -- the server's side: requests in, responses out -------------------------------------------------


def decode_infer_request(
    message: Any | Framed, max_elements: int = MAX_ELEMENTS
) -> InferenceRequest:
    """Decode a ModelInferRequest; anything inconsistent is InvalidInput saying what and where.

    Raw inputs are views of the message's blobs (of the received bytes when `Framed`). No tensor
    may declare more than `max_elements` elements, nor more than its data carries.
    """
    message, raw = _unframed(message, RAW_INPUT_FIELD)
    check_id(message.id)
    inputs, in_regions = _read_tensors(message.inputs, raw, "request", None, max_elements)
    outputs = None
    if message.outputs:
        outputs = [_requested_output(o) for o in message.outputs]
    # In field order, no keywords: a call with keywords builds a dict per request.
    return InferenceRequest(
        message.model_name,
        inputs,
        message.model_version,
        message.id,
        outputs,
        parameters(message.parameters),
        in_regions,
    )


def wants_raw(request: InferenceRequest) -> bool:
    """Raw outputs unless the request sets binary_data_output false (tritonclient reads raw)."""
    flag = request.parameters.get("binary_data_output")
    return flag if isinstance(flag, bool) else True


def frame_infer_response(response: InferenceResponse, raw: bool, max_bytes: int) -> Framed:
    """A ModelInferResponse, all outputs raw or all typed (FP16/BF16 force raw for the whole);
    raw outputs stay views of the arrays until `serialize` joins them."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    if response.parameters:  # most answers have none: no call for an empty loop
        _set_parameters(message.parameters, response.parameters)
    blobs: list[Buffer] = []
    size = _write_tensors(message.outputs, blobs, response.outputs, raw, "output")
    if response.in_regions:
        _write_regions(message.outputs, response.in_regions)
        if blobs or (raw and not response.outputs):
            blobs += [b""] * len(response.in_regions)
    # ByteSize() serializes under upb: only a response near the limit pays for it.
    if size >= max_bytes * 0.9:
        _check_size(message, size, max_bytes)
    return Framed(message, blobs)


def encode_infer_response(response: InferenceResponse, raw: bool, max_bytes: int) -> Any:
    """The whole ModelInferResponse message (raw contents copied in)."""
    return frame_infer_response(response, raw, max_bytes).whole(RAW_OUTPUT_FIELD)


def _requested_output(message: Any) -> RequestedOutput:
    params = parameters(message.parameters)
    binary = params.get("binary_data")
    return RequestedOutput(
        name=message.name,
        binary=binary if isinstance(binary, bool) else None,
        parameters=params,
        region=region_of("output", message.name, params),
    )


def _check_size(message: Any, estimate: int, max_bytes: int) -> None:
    size = message.ByteSize() + estimate + 16
    if size > max_bytes:
        raise PayloadTooLarge(
            f"the response is {size} bytes, above the server's gRPC message limit of {max_bytes} "
            "bytes; ask for fewer rows or outputs, or raise the limit (max_message_bytes)"
        )


# -- the client's side: requests out, responses in -------------------------------------------------


def frame_infer_request(request: InferenceRequest) -> Framed:
    """A ModelInferRequest with every input raw (as tritonclient sends them), still as views."""
    message = pb.ModelInferRequest(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    _set_parameters(message.parameters, request.parameters)
    for wanted in request.outputs or []:
        params = wanted.parameters
        if wanted.region is not None:
            params = params | region_parameters(wanted.region)
        _set_parameters(message.outputs.add(name=wanted.name).parameters, params)
    blobs: list[Buffer] = []
    _write_tensors(message.inputs, blobs, request.inputs, True, "input")
    _write_regions(message.inputs, request.in_regions)
    return Framed(message, blobs)


def encode_infer_request(request: InferenceRequest) -> Any:
    """The whole ModelInferRequest message (raw contents copied in)."""
    return frame_infer_request(request).whole(RAW_INPUT_FIELD)


def decode_infer_response(
    message: Any | Framed, placed: Mapping[str, RegionRef] | None = None
) -> InferenceResponse:
    """Decode a ModelInferResponse, raw or typed, with the server's readers.

    `placed` names the outputs the request asked into regions: such an output answered without
    contents (and without region parameters, as Triton answers) reads as that region.
    """
    message, raw = _unframed(message, RAW_OUTPUT_FIELD)
    outputs, in_regions = _read_tensors(message.outputs, raw, "response", placed or {})
    return InferenceResponse(
        model_name=message.model_name,
        outputs=outputs,
        model_version=message.model_version,
        id=message.id,
        parameters=parameters(message.parameters),
        in_regions=in_regions,
    )


# -- tensors, both ways ----------------------------------------------------------------------------


def _unframed(message: Any | Framed, field: int) -> tuple[Any, Sequence[Any]]:
    if isinstance(message, Framed):
        return message.message, message.raw
    return message, getattr(message, _RAW_NAMES[field])


def _read_tensors(
    tensors: Any,
    raw: Any,
    what: str,
    placed: Mapping[str, RegionRef] | None = None,
    max_elements: int = MAX_ELEMENTS,
) -> tuple[dict[str, np.ndarray], dict[str, RegionTensor]]:
    role = "input" if what == "request" else "output"
    entries = [_entry(role, t, placed, max_elements) for t in tensors]
    blobs = _raw_blobs(entries, raw, role, what)
    arrays: dict[str, np.ndarray] = {}
    in_regions: dict[str, RegionTensor] = {}
    for (tensor, ref, contents), blob in zip(entries, blobs, strict=True):
        name = tensor.name
        if name in arrays or name in in_regions:
            raise InvalidInput(f"{role} {name!r} appears more than once in the {what}")
        if ref is not None:
            if contents.ListFields() or blob:
                raise InvalidInput(
                    f"{role} {name!r} gives {REGION!r} and contents too: a tensor in a "
                    "shared-memory region carries no data in the message"
                )
            in_regions[name] = RegionTensor(tensor.datatype, tensor.shape, ref)
            continue
        if raw:  # read_tensor's checks, the shape's made by `_entry` already
            arrays[name] = read_raw_checked(tensor, blob, GRPC_WORDS)
        else:
            arrays[name] = read_tensor(tensor, _typed(tensor, contents), max_elements)
    return arrays, in_regions


def _entry(
    role: str, entry: Any, placed: Mapping[str, RegionRef] | None, max_elements: int
) -> tuple[WireTensor, RegionRef | None, Any]:
    """A message's tensor: what it says of itself, the region it names, and its contents; its
    shape checked against `max_elements` (also in a region, before anything is read)."""
    name = entry.name
    shape = tuple(entry.shape[:])  # a slice: iterating protobuf's field itself is slower
    check_shape(role, name, shape, max_elements)
    datatype = parse_datatype(role, name, entry.datatype)
    params = parameters(entry.parameters)
    ref = region_of(role, name, params)
    if ref is None and placed and name in placed:
        ref = placed[name]
    # Raw tensors have no typed contents: reading the field would make an empty message each.
    contents = entry.contents if entry.HasField("contents") else _NO_CONTENTS
    return WireTensor(role, name, datatype, shape, params), ref, contents


def _raw_blobs(
    entries: Sequence[tuple[WireTensor, RegionRef | None, Any]], raw: Any, role: str, what: str
) -> list[Any]:
    """Each tensor's raw blob (b"" for tensors in regions, None when the message has none).

    A message gives either one blob per tensor, or one per tensor not in a region (in order).
    """
    if not raw:
        return [None] * len(entries)
    typed = [t.name for t, _, c in entries if c is not _NO_CONTENTS and c.ListFields()]
    if typed:
        raise InvalidInput(
            f"{role}s {typed} carry typed contents while the {what} also carries "
            f"raw_{role}_contents; use one or the other for all {role}s of a {what}"
        )
    if len(raw) == len(entries):
        return list(raw)
    carried = [ref is None for _, ref, _ in entries]
    if len(raw) != sum(carried):
        which = f"{role}s" if all(carried) else f"{role}s outside shared memory"
        raise InvalidInput(
            f"the {what} has {sum(carried)} {which} but {len(raw)} raw_{role}_contents; "
            f"give one raw blob per {role}, in the order of the {role}s"
        )
    blobs = iter(raw)
    return [next(blobs) if has_blob else b"" for has_blob in carried]


def _typed(tensor: WireTensor, contents: Any) -> TypedValues:
    role, name, datatype = tensor.role, tensor.name, tensor.datatype
    if datatype not in TYPED_FIELDS:
        raise InvalidInput(
            f"{role} {name!r} is {datatype.value}, which cannot travel as typed contents; "
            f"send it in raw_{role}_contents"
        )
    field, wire = TYPED_FIELDS[datatype]
    stray = [f.name for f, _ in contents.ListFields() if f.name != field]
    if stray:
        raise InvalidInput(
            f"{role} {name!r} is {datatype.value}, but its contents are in {stray} "
            f"(expected {field})"
        )
    return TypedValues(field, getattr(contents, field), wire)


def _write_regions(tensors: Any, in_regions: Mapping[str, RegionTensor]) -> None:
    """Add each tensor placed in a region: shape, datatype and the region, and no contents."""
    for name, placed in in_regions.items():
        tensor = tensors.add(name=name, datatype=placed.datatype.value, shape=placed.shape)
        _set_parameters(tensor.parameters, region_parameters(placed.ref))


def _write_tensors(
    tensors: Any, blobs: list[Buffer], arrays: Mapping[str, np.ndarray], raw: bool, role: str
) -> int:
    """Add each array to a message's tensors (raw: its memory to `blobs`); about how many bytes."""
    datatypes = {n: Datatype.from_numpy(a.dtype) for n, a in arrays.items()}
    form = _RAW if raw or any(d not in TYPED_FIELDS for d in datatypes.values()) else _TYPED
    size = 0
    for name, array in arrays.items():
        datatype = datatypes[name]
        tensor = tensors.add(name=name, datatype=_NAMES[datatype], shape=array.shape)
        if form is _RAW:  # write_raw: write_tensor's raw form without a `Written` around it
            data = write_raw(array, datatype)
            blobs.append(data)
            size += nbytes(data)
            continue
        written = write_tensor(role, name, array, datatype, form)  # typed: values, never raw
        getattr(tensor.contents, TYPED_FIELDS[datatype][0]).extend(written.values)
        size += array.size * 8
    return size
