"""Open Inference Protocol REST tensors: JSON and the binary tensor data extension, both ways.

Decoding turns a request body into a protocol-agnostic `InferenceRequest`; encoding turns an
`InferenceResponse` into body parts. Binary tensors are read with `numpy.frombuffer` straight
from the body (no copy) and written as views of the output arrays.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np
import orjson

from dlscale.errors import InvalidInput
from dlscale.types import Datatype, InferenceRequest, InferenceResponse, RequestedOutput, TensorSpec

Buffer = bytes | bytearray | memoryview
ParameterValue = bool | int | float | str

_LENGTH = struct.Struct("<I")
_INTEGER = "iu"


class _Tensor(msgspec.Struct):
    name: str
    shape: list[Annotated[int, msgspec.Meta(ge=0)]]
    datatype: str
    parameters: dict[str, ParameterValue] = {}
    data: Any = None


class _Output(msgspec.Struct):
    name: str
    parameters: dict[str, ParameterValue] = {}


class _Request(msgspec.Struct):
    inputs: list[_Tensor]
    id: str = ""
    parameters: dict[str, ParameterValue] = {}
    outputs: list[_Output] | None = None


_DECODER = msgspec.json.Decoder(_Request)
_DATATYPES = {d.value: d for d in Datatype}


@dataclass(frozen=True)
class OutputFormat:
    """How the client wants outputs sent: each one in JSON or as binary data."""

    all_binary: bool = False
    binary: frozenset[str] = frozenset()

    def is_binary(self, name: str) -> bool:
        """Whether output `name` goes as binary data after the JSON header."""
        return self.all_binary or name in self.binary


@dataclass(frozen=True)
class EncodedResponse:
    """A response body as parts to write in order; `header_length` is set when binary follows."""

    parts: list[Buffer]
    header_length: int | None

    @property
    def size(self) -> int:
        """Total body length in bytes."""
        return sum(len(p) for p in self.parts)


# -- decoding --------------------------------------------------------------------------------------


def decode_request(
    body: Buffer, header_length: int | None, model: str, version: str = ""
) -> tuple[InferenceRequest, OutputFormat]:
    """Decode a request body; `header_length` is Inference-Header-Content-Length, if given."""
    view = memoryview(body)
    json_end = len(view) if header_length is None else header_length
    if json_end > len(view):
        raise InvalidInput(
            f"Inference-Header-Content-Length is {json_end}, but the body has only "
            f"{len(view)} bytes"
        )
    if json_end == 0:
        raise InvalidInput("the request body is empty: expected a JSON inference request")
    try:
        doc = _DECODER.decode(view[:json_end])
    except msgspec.ValidationError as exc:
        raise InvalidInput(f"invalid inference request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"malformed JSON in the inference request: {exc}") from None
    params = dict(doc.parameters)
    _check_schedule_parameters(params)
    inputs: dict[str, np.ndarray] = {}
    offset = json_end
    for tensor in doc.inputs:
        if tensor.name in inputs:
            raise InvalidInput(f"input {tensor.name!r} appears twice in the request")
        array, offset = _decode_tensor(tensor, view, offset, header_length is not None)
        inputs[tensor.name] = array
    if offset != len(view):
        raise InvalidInput(
            f"the body has {len(view) - offset} bytes after the JSON header and the binary "
            "tensors; the inputs' binary_data_size values do not add up to the body length"
        )
    outputs, fmt = _requested_outputs(doc.outputs, params)
    request = InferenceRequest(
        model_name=model,
        model_version=version,
        inputs=inputs,
        id=doc.id,
        outputs=outputs,
        parameters=params,
    )
    return request, fmt


def decode_raw_request(
    body: Buffer, spec: TensorSpec, batched: bool, model: str, version: str = ""
) -> tuple[InferenceRequest, OutputFormat]:
    """Decode the raw binary form (Inference-Header-Content-Length: 0) of a single-input model.

    The body is the input's bytes for a batch of 1; every output is sent back as binary.
    """
    view = memoryview(body)
    shape = list(spec.shape)
    if batched and shape:
        shape[0] = 1
    shape = _fill_unknown_dim(spec, shape, len(view))
    tensor = _Tensor(name=spec.name, shape=shape, datatype=spec.datatype.value)
    array = _from_binary(tensor, spec.datatype, view)
    request = InferenceRequest(
        model_name=model, model_version=version, inputs={spec.name: array}, parameters={}
    )
    return request, OutputFormat(all_binary=True)


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


def _check_schedule_parameters(params: dict[str, ParameterValue]) -> None:
    for key in ("priority", "timeout"):
        value = params.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(
                f"parameter {key!r} must be a non-negative integer, got {value!r}"
                + (" (microseconds)" if key == "timeout" else "")
            )


def _requested_outputs(
    outputs: list[_Output] | None, params: dict[str, ParameterValue]
) -> tuple[list[RequestedOutput] | None, OutputFormat]:
    all_binary = _flag(params, "binary_data_output", "request")
    if outputs is None:
        return None, OutputFormat(all_binary=all_binary)
    wanted, binary = [], set()
    for out in outputs:
        is_binary = _flag(out.parameters, "binary_data", f"output {out.name!r}")
        wanted.append(RequestedOutput(out.name, is_binary, dict(out.parameters)))
        if is_binary:
            binary.add(out.name)
    return wanted, OutputFormat(all_binary=all_binary, binary=frozenset(binary))


def _flag(params: dict[str, ParameterValue], key: str, where: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"parameter {key!r} of the {where} must be true or false, got {value!r}")
    return value


def _decode_tensor(
    tensor: _Tensor, body: memoryview, offset: int, has_binary: bool
) -> tuple[np.ndarray, int]:
    datatype = _DATATYPES.get(tensor.datatype)
    if datatype is None:
        raise InvalidInput(
            f"input {tensor.name!r} has unknown datatype {tensor.datatype!r} (expected one of "
            f"{[d.value for d in Datatype]})"
        )
    size = tensor.parameters.get("binary_data_size")
    if size is None:
        return _from_json(tensor, datatype), offset
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidInput(
            f"input {tensor.name!r}: binary_data_size must be a non-negative integer, got {size!r}"
        )
    if not has_binary:
        raise InvalidInput(
            f"input {tensor.name!r} gives binary_data_size, but the request has no "
            "Inference-Header-Content-Length header to say where the JSON ends"
        )
    if tensor.data is not None:
        raise InvalidInput(f"input {tensor.name!r} gives both data and binary_data_size")
    if offset + size > len(body):
        raise InvalidInput(
            f"input {tensor.name!r} has binary_data_size {size}, but only {len(body) - offset} "
            "bytes of the body remain"
        )
    return _from_binary(tensor, datatype, body[offset : offset + size]), offset + size


def _from_binary(tensor: _Tensor, datatype: Datatype, chunk: memoryview) -> np.ndarray:
    count = math.prod(tensor.shape)
    if datatype is Datatype.BYTES:
        return _parse_bytes(tensor.name, chunk, count).reshape(tensor.shape)
    expected = count * datatype.itemsize
    if len(chunk) != expected:
        raise InvalidInput(
            f"input {tensor.name!r} of shape {tensor.shape} and datatype {datatype.value} takes "
            f"{expected} bytes, but {len(chunk)} were sent"
        )
    # The wire is little-endian, as are the hosts dlscale runs on; no byte swapping needed.
    return np.frombuffer(chunk, dtype=datatype.numpy, count=count).reshape(tensor.shape)


def _parse_bytes(name: str, chunk: memoryview, count: int) -> np.ndarray:
    out = np.empty(count, dtype=object)
    pos, n = 0, 0
    while pos < len(chunk):
        if pos + 4 > len(chunk) or n == count:
            break
        (length,) = _LENGTH.unpack_from(chunk, pos)
        pos += 4
        if pos + length > len(chunk):
            raise InvalidInput(
                f"BYTES input {name!r}: element {n} claims {length} bytes, but only "
                f"{len(chunk) - pos} remain"
            )
        out[n] = bytes(chunk[pos : pos + length])
        pos += length
        n += 1
    if n != count or pos != len(chunk):
        raise InvalidInput(
            f"BYTES input {name!r}: its shape holds {count} elements, but the binary data "
            f"({len(chunk)} bytes of 4-byte lengths and values) holds {n}"
            + ("" if pos == len(chunk) else f" and {len(chunk) - pos} bytes more")
        )
    return out


def _from_json(tensor: _Tensor, datatype: Datatype) -> np.ndarray:
    name = tensor.name
    if not datatype.json_safe:
        raise InvalidInput(
            f"input {name!r} is {datatype.value}, which JSON cannot carry: send it as binary data "
            "(parameter binary_data_size and Inference-Header-Content-Length)"
        )
    if tensor.data is None:
        raise InvalidInput(f"input {name!r} has neither data nor binary_data_size")
    data = tensor.data if isinstance(tensor.data, list) else [tensor.data]
    array = _strings(name, data) if datatype is Datatype.BYTES else _numbers(name, data, datatype)
    count = math.prod(tensor.shape)
    if array.size != count:
        raise InvalidInput(
            f"input {name!r} has shape {tensor.shape} ({count} elements), but its data holds "
            f"{array.size}"
        )
    return array.reshape(tensor.shape)


def _numbers(name: str, data: list[Any], datatype: Datatype) -> np.ndarray:
    try:
        array = np.array(data)
    except (ValueError, OverflowError):
        raise InvalidInput(
            f"data of input {name!r} is ragged: nested lists must have equal lengths"
        ) from None
    kind = array.dtype.kind
    target = datatype.numpy
    if array.size == 0:
        return array.astype(target)
    if datatype is Datatype.BOOL:
        ok = kind == "b"
    elif target.kind in _INTEGER:
        ok = kind in _INTEGER
    else:
        ok = kind in "iuf"
    if not ok:
        want = {"b": "true/false", "i": "integers", "u": "integers"}.get(target.kind, "numbers")
        raise InvalidInput(
            f"data of input {name!r} must hold {want} for datatype {datatype.value}; got "
            f"{_describe(array)}"
        )
    if target.kind in _INTEGER:
        info = np.iinfo(target)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise InvalidInput(
                f"data of input {name!r} has values in [{low}, {high}], outside the range of "
                f"{datatype.value} [{info.min}, {info.max}]"
            )
    return array.astype(target, copy=False)


def _describe(array: np.ndarray) -> str:
    kind = array.dtype.kind
    return {
        "b": "booleans",
        "f": "non-integer numbers",
        "U": "strings",
        "O": "mixed or non-numeric values",
    }.get(kind, str(array.dtype))


def _strings(name: str, data: list[Any]) -> np.ndarray:
    flat: list[Any] = []
    _flatten(data, flat)
    if not all(isinstance(s, str) for s in flat):
        raise InvalidInput(f"data of BYTES input {name!r} must hold strings only")
    out = np.empty(len(flat), dtype=object)
    out[:] = [s.encode() for s in flat]
    return out


def _flatten(data: list[Any], out: list[Any]) -> None:
    for item in data:
        if isinstance(item, list):
            _flatten(item, out)
        else:
            out.append(item)


# -- encoding --------------------------------------------------------------------------------------


def encode_response(response: InferenceResponse, fmt: OutputFormat) -> EncodedResponse:
    """Encode a response: a JSON header, then the binary outputs in the order the header lists."""
    outputs: list[dict[str, Any]] = []
    binaries: list[Buffer] = []
    for name, array in response.outputs.items():
        datatype = Datatype.from_numpy(array.dtype)
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype.value,
            "shape": list(array.shape),
        }
        if fmt.is_binary(name) or not datatype.json_safe:
            raw = _to_binary(array, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            binaries.append(raw)
        else:
            entry["data"] = _to_json(name, array, datatype)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": response.model_name}
    if response.model_version:
        doc["model_version"] = response.model_version
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not binaries:
        return EncodedResponse([header], None)
    return EncodedResponse([header, *binaries], len(header))


def _to_json(name: str, array: np.ndarray, datatype: Datatype) -> Any:
    if datatype is Datatype.BYTES:
        try:
            return [_text(x) for x in array.reshape(-1)]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output {name!r} holds bytes that are not UTF-8, which JSON cannot carry; ask "
                "for it with the parameter binary_data: true"
            ) from None
    return np.ascontiguousarray(array).reshape(-1)


def _text(item: object) -> str:
    return item.decode() if isinstance(item, bytes) else str(item)


def _to_binary(array: np.ndarray, datatype: Datatype) -> Buffer:
    if datatype is Datatype.BYTES:
        return serialize_bytes(array.reshape(-1))
    flat: Any = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # numpy lacks Buffer hints
    return memoryview(flat)


def serialize_bytes(items: Sequence[object] | np.ndarray) -> bytes:
    """BYTES elements on the wire: each as a 4-byte little-endian length, then its bytes."""
    parts = []
    for item in items:
        raw = item if isinstance(item, bytes) else str(item).encode()
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)
