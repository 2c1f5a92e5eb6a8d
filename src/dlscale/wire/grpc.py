"""ModelInfer messages ⇄ dlscale.types, both ways: the server's and the clients' one converter.

Tensors travel either all as typed `contents` or all as raw contents (one little-endian blob per
tensor, in order), never both in one message. The server decodes requests and encodes responses;
the bench's clients encode requests and decode responses with the same readers and writers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput, PayloadTooLarge, Unsupported
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestedOutput,
)
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb
from dlscale.wire.tensors import (
    Form,
    RawData,
    TypedValues,
    WireTensor,
    Wording,
    parse_datatype,
    read_tensor,
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


# -- parameters ------------------------------------------------------------------------------------


def parameters(params: Mapping[str, Any]) -> Parameters:
    """A protobuf parameter map as plain values (uint64 and int64 both become int)."""
    out: Parameters = {}
    if not params:  # the common case; iterating even an empty upb map costs microseconds
        return out
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidInput(f"parameter {key!r} has no value")
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


def decode_infer_request(message: Any) -> InferenceRequest:
    """Decode a ModelInferRequest; anything inconsistent is InvalidInput saying what and where."""
    inputs = _read_tensors(message.inputs, message.raw_input_contents, "request")
    outputs = None
    if message.outputs:
        outputs = [_requested_output(o) for o in message.outputs]
    return InferenceRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters(message.parameters),
    )


def wants_raw(request: InferenceRequest) -> bool:
    """Raw outputs unless the request sets binary_data_output false (tritonclient reads raw)."""
    flag = request.parameters.get("binary_data_output")
    return flag if isinstance(flag, bool) else True


def encode_infer_response(response: InferenceResponse, raw: bool, max_bytes: int) -> Any:
    """A ModelInferResponse: all outputs raw or all typed (FP16/BF16 force raw for the whole)."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    _set_parameters(message.parameters, response.parameters)
    size = _write_tensors(
        message.outputs, message.raw_output_contents, response.outputs, raw, "output"
    )
    _check_size(message, size, max_bytes)
    return message


def _requested_output(message: Any) -> RequestedOutput:
    params = parameters(message.parameters)
    if "classification" in params:
        raise Unsupported(
            f"output {message.name!r} asks for classification, which this server does not offer"
        )
    binary = params.get("binary_data")
    return RequestedOutput(
        name=message.name,
        binary=binary if isinstance(binary, bool) else None,
        parameters=params,
    )


def _check_size(message: Any, estimate: int, max_bytes: int) -> None:
    # ByteSize() serializes under upb; only pay for it when the response is near the limit.
    if estimate < max_bytes * 0.9:
        return
    size = message.ByteSize()
    if size > max_bytes:
        raise PayloadTooLarge(
            f"the response is {size} bytes, above the server's gRPC message limit of {max_bytes} "
            "bytes; ask for fewer rows or outputs, or raise the limit (max_message_bytes)"
        )


# -- the client's side: requests out, responses in -------------------------------------------------


def encode_infer_request(request: InferenceRequest) -> Any:
    """A ModelInferRequest with every input in raw contents (as tritonclient sends them)."""
    message = pb.ModelInferRequest(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    _set_parameters(message.parameters, request.parameters)
    for wanted in request.outputs or []:
        _set_parameters(message.outputs.add(name=wanted.name).parameters, wanted.parameters)
    _write_tensors(message.inputs, message.raw_input_contents, request.inputs, True, "input")
    return message


def decode_infer_response(message: Any) -> InferenceResponse:
    """Decode a ModelInferResponse, raw or typed, with the server's readers."""
    return InferenceResponse(
        model_name=message.model_name,
        outputs=_read_tensors(message.outputs, message.raw_output_contents, "response"),
        model_version=message.model_version,
        id=message.id,
        parameters=parameters(message.parameters),
    )


# -- tensors, both ways ----------------------------------------------------------------------------


def _read_tensors(tensors: Any, raw: Any, what: str) -> dict[str, np.ndarray]:
    role = "input" if what == "request" else "output"
    if raw:
        typed = [t.name for t in tensors if t.contents.ListFields()]
        if typed:
            raise InvalidInput(
                f"{role}s {typed} carry typed contents while the {what} also carries "
                f"raw_{role}_contents; use one or the other for all {role}s of a {what}"
            )
        if len(raw) != len(tensors):
            raise InvalidInput(
                f"the {what} has {len(tensors)} {role}s but {len(raw)} raw_{role}_contents; "
                f"give one raw blob per {role}, in the order of the {role}s"
            )
    arrays: dict[str, np.ndarray] = {}
    for i, entry in enumerate(tensors):
        name = entry.name
        if name in arrays:
            raise InvalidInput(f"{role} {name!r} appears more than once in the {what}")
        shape = tuple(entry.shape)
        if any(d < 0 for d in shape):
            raise InvalidInput(f"{role} {name!r} has shape {list(shape)}: dimensions must be >= 0")
        datatype = parse_datatype(role, name, entry.datatype)
        tensor = WireTensor(role, name, datatype, shape, parameters(entry.parameters))
        source = RawData(raw[i], GRPC_WORDS) if raw else _typed(tensor, entry.contents)
        arrays[name] = read_tensor(tensor, source)
    return arrays


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


def _write_tensors(
    tensors: Any, blobs: Any, arrays: Mapping[str, np.ndarray], raw: bool, role: str
) -> int:
    """Add each array to a message's tensors (and raw blobs); returns about how many bytes."""
    datatypes = {n: Datatype.from_numpy(a.dtype) for n, a in arrays.items()}
    form = Form.RAW if raw or any(d not in TYPED_FIELDS for d in datatypes.values()) else Form.TYPED
    size = 0
    for name, array in arrays.items():
        datatype = datatypes[name]
        tensor = tensors.add(name=name, datatype=datatype.value, shape=array.shape)
        written = write_tensor(role, name, array, datatype, form)
        if written.raw is not None:
            blob = bytes(written.raw)
            blobs.append(blob)
            size += len(blob)
        else:
            getattr(tensor.contents, TYPED_FIELDS[datatype][0]).extend(written.values)
            size += array.size * 8
    return size
