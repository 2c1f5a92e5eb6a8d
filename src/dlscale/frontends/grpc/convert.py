"""Protobuf ⇄ dlscale.types: the only module that reads or builds the gRPC messages."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput, PayloadTooLarge, Unsupported
from dlscale.frontends.grpc.grpc_gen import inference_pb2 as pb
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    Parameters,
    RequestedOutput,
)

#: The typed-contents field of each datatype, and the numpy type protobuf hands it back as.
_TYPED: dict[Datatype, tuple[str, np.dtype[Any]]] = {
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
_LENGTH = struct.Struct("<I")

# -- requests -----------------------------------------------------------------------------------


def name_version(message: Any) -> tuple[str, str]:
    """The (name, version) of a ModelReady/ModelMetadata/ModelConfig/ModelStatistics request."""
    return message.name, message.version


def model_name(message: Any) -> str:
    """The model named by a RepositoryModelLoad or RepositoryModelUnload request."""
    return str(message.model_name)


def ready_only(message: Any) -> bool:
    """Whether a RepositoryIndex request asks for ready models only."""
    return bool(message.ready)


def load_overrides(message: Any) -> list[str]:
    """Names of the load parameters that ask for a config or files override."""
    return [k for k in message.parameters if k == "config" or k.startswith("file:")]


def parameters(params: Mapping[str, Any]) -> Parameters:
    """A protobuf parameter map as plain values (uint64 and int64 both become int)."""
    out: Parameters = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidInput(f"parameter {key!r} has no value")
        out[key] = getattr(value, which)
    return out


def infer_request(message: Any) -> InferenceRequest:
    """Decode a ModelInferRequest; anything inconsistent is InvalidInput saying what and where."""
    raw = message.raw_input_contents
    inputs = message.inputs
    if raw:
        typed = [t.name for t in inputs if t.contents.ListFields()]
        if typed:
            raise InvalidInput(
                f"inputs {typed} carry typed contents while the request also carries "
                "raw_input_contents; use one or the other for all inputs of a request"
            )
        if len(raw) != len(inputs):
            raise InvalidInput(
                f"the request has {len(inputs)} inputs but {len(raw)} raw_input_contents; "
                "give one raw blob per input, in the order of the inputs"
            )
    arrays: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(inputs):
        name = tensor.name
        if name in arrays:
            raise InvalidInput(f"input {name!r} appears more than once in the request")
        datatype = _datatype(name, tensor.datatype)
        shape = _shape(name, tensor.shape)
        if raw:
            arrays[name] = _from_raw(name, datatype, shape, raw[i])
        else:
            arrays[name] = _from_typed(name, datatype, shape, tensor.contents)
    outputs = None
    if message.outputs:
        outputs = [_requested_output(o) for o in message.outputs]
    return InferenceRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        id=message.id,
        inputs=arrays,
        outputs=outputs,
        parameters=parameters(message.parameters),
    )


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


def _datatype(name: str, text: str) -> Datatype:
    try:
        return Datatype(text)
    except ValueError:
        known = ", ".join(d.value for d in Datatype)
        raise InvalidInput(
            f"input {name!r} has unknown datatype {text!r} (known: {known})"
        ) from None


def _shape(name: str, dims: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(dims)
    if any(d < 0 for d in shape):
        raise InvalidInput(f"input {name!r} has shape {list(shape)}: dimensions must be >= 0")
    return shape


def _from_raw(name: str, datatype: Datatype, shape: tuple[int, ...], blob: bytes) -> np.ndarray:
    count = math.prod(shape)
    if datatype is Datatype.BYTES:
        return _split_bytes(name, blob, count).reshape(shape)
    want = count * datatype.itemsize
    if len(blob) != want:
        raise InvalidInput(
            f"input {name!r}: its raw contents hold {len(blob)} bytes, but shape {list(shape)} "
            f"of {datatype.value} needs {want}"
        )
    # Read-only and zero-copy: the request's bytes live as long as the array does.
    return np.frombuffer(blob, dtype=datatype.numpy).reshape(shape)


def _split_bytes(name: str, blob: bytes, count: int) -> np.ndarray:
    out = np.empty(count, dtype=object)
    pos, end = 0, len(blob)
    for i in range(count):
        if pos + 4 > end:
            raise InvalidInput(
                f"input {name!r}: its BYTES raw contents end after {i} of {count} elements"
            )
        (size,) = _LENGTH.unpack_from(blob, pos)
        pos += 4
        if pos + size > end:
            raise InvalidInput(
                f"input {name!r}: BYTES element {i} declares {size} bytes, but only {end - pos} "
                "remain in its raw contents"
            )
        out[i] = blob[pos : pos + size]
        pos += size
    if pos != end:
        raise InvalidInput(
            f"input {name!r}: {end - pos} bytes remain in its BYTES raw contents after the "
            f"{count} elements its shape holds"
        )
    return out


def _from_typed(name: str, datatype: Datatype, shape: tuple[int, ...], contents: Any) -> np.ndarray:
    if datatype not in _TYPED:
        raise InvalidInput(
            f"input {name!r} is {datatype.value}, which cannot travel as typed contents; "
            "send it in raw_input_contents"
        )
    field, wire = _TYPED[datatype]
    present = [f.name for f, _ in contents.ListFields()]
    stray = [f for f in present if f != field]
    if stray:
        raise InvalidInput(
            f"input {name!r} is {datatype.value}, but its contents are in {stray} "
            f"(expected {field})"
        )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(
            f"input {name!r}: {len(values)} values in {field}, but shape {list(shape)} holds "
            f"{count}"
        )
    if datatype is Datatype.BYTES:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    array = np.array(values, dtype=wire)
    target = datatype.numpy
    if target != wire:
        narrowed = array.astype(target)
        if not np.array_equal(narrowed, array):
            raise InvalidInput(f"input {name!r}: values out of range for {datatype.value}")
        array = narrowed
    return array.reshape(shape)


# -- responses ----------------------------------------------------------------------------------


def wants_raw(request: InferenceRequest) -> bool:
    """Raw outputs unless the request sets binary_data_output false (tritonclient reads raw)."""
    flag = request.parameters.get("binary_data_output")
    return flag if isinstance(flag, bool) else True


def infer_response(
    response: InferenceResponse, raw: bool, max_bytes: int, stream: bool = False
) -> Any:
    """Encode a response: all outputs raw or all typed (FP16/BF16 force raw for the whole)."""
    tensors = []
    blobs: list[bytes] = []
    datatypes = {n: Datatype.from_numpy(a.dtype) for n, a in response.outputs.items()}
    raw = raw or any(d not in _TYPED for d in datatypes.values())
    size = 0
    for name, array in response.outputs.items():
        datatype = datatypes[name]
        tensor = pb.ModelInferResponse.InferOutputTensor(
            name=name, datatype=datatype.value, shape=array.shape
        )
        if raw:
            blob = _to_raw(datatype, array)
            size += len(blob)
            blobs.append(blob)
        else:
            field, _ = _TYPED[datatype]
            values = getattr(tensor.contents, field)
            if datatype is Datatype.BYTES:
                values.extend(_as_bytes(v) for v in array.flat)
            else:
                values.extend(array.ravel().tolist())
            size += array.size * 8
        tensors.append(tensor)
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        outputs=tensors,
        raw_output_contents=blobs,
    )
    _check_size(message, size, max_bytes)
    if stream:
        return pb.ModelStreamInferResponse(infer_response=message)
    return message


def stream_error(text: str, message: Any) -> Any:
    """An in-stream error for a ModelInferRequest; its id ties the error to the request."""
    echo = pb.ModelInferResponse(
        model_name=message.model_name, model_version=message.model_version, id=message.id
    )
    return pb.ModelStreamInferResponse(error_message=text, infer_response=echo)


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


def _to_raw(datatype: Datatype, array: np.ndarray) -> bytes:
    if datatype is not Datatype.BYTES:
        return array.tobytes()
    parts = []
    for value in array.flat:
        data = _as_bytes(value)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def _as_bytes(value: object) -> bytes:
    # ONNX Runtime hands string tensors back as str; the protocol's BYTES are bytes.
    if isinstance(value, bytes):
        return value
    return str(value).encode()


# -- health, metadata, config -------------------------------------------------------------------


def server_live(live: bool) -> Any:
    """ServerLiveResponse."""
    return pb.ServerLiveResponse(live=live)


def server_ready(ready: bool) -> Any:
    """ServerReadyResponse."""
    return pb.ServerReadyResponse(ready=ready)


def model_ready(ready: bool) -> Any:
    """ModelReadyResponse."""
    return pb.ModelReadyResponse(ready=ready)


def server_metadata(meta: Mapping[str, Any]) -> Any:
    """ServerMetadataResponse from DataPlane.server_metadata()."""
    return pb.ServerMetadataResponse(
        name=meta["name"], version=meta["version"], extensions=meta["extensions"]
    )


def model_metadata(meta: Mapping[str, Any]) -> Any:
    """ModelMetadataResponse from DataPlane.model_metadata()."""
    return pb.ModelMetadataResponse(
        name=meta["name"],
        versions=meta["versions"],
        platform=meta["platform"],
        inputs=[_tensor_metadata(t) for t in meta["inputs"]],
        outputs=[_tensor_metadata(t) for t in meta["outputs"]],
    )


def _tensor_metadata(tensor: Mapping[str, Any]) -> Any:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
    )


def model_config(config: Mapping[str, Any], meta: Mapping[str, Any]) -> Any:
    """ModelConfigResponse in Triton's layout, from DataPlane.model_config() and metadata."""
    max_batch = int(config["max_batch_size"])
    skip = 1 if max_batch > 0 else 0  # Triton's dims leave out the batch dimension
    batching = config["batching"]
    groups = []
    for i, group in enumerate(config["instances"]):
        device = str(group["device"])
        gpu = device.startswith(("cuda", "MIG-"))
        index = device.partition(":")[2]
        groups.append(
            pb.ModelInstanceGroup(
                name=f"{config['name']}_{i}",
                count=group["count"],
                kind=pb.ModelInstanceGroup.KIND_GPU if gpu else pb.ModelInstanceGroup.KIND_CPU,
                gpus=[int(index)] if index.isdigit() else [],
            )
        )
    message = pb.ModelConfig(
        name=config["name"],
        platform=meta["platform"],
        backend=config["backend"],
        max_batch_size=max_batch,
        input=[
            pb.ModelInput(name=t["name"], data_type=_data_type(t), dims=t["shape"][skip:])
            for t in meta["inputs"]
        ],
        output=[
            pb.ModelOutput(name=t["name"], data_type=_data_type(t), dims=t["shape"][skip:])
            for t in meta["outputs"]
        ],
        instance_group=groups,
        parameters={
            k: pb.ModelParameter(string_value=str(v)) for k, v in config["metadata"].items()
        },
    )
    if max_batch > 0:
        message.dynamic_batching.CopyFrom(
            pb.ModelDynamicBatching(
                preferred_batch_size=batching["preferred_batch_sizes"],
                max_queue_delay_microseconds=batching["max_queue_delay_us"],
                priority_levels=batching["priority_levels"],
                default_priority_level=batching["default_priority_level"],
                default_queue_policy=pb.ModelQueuePolicy(
                    default_timeout_microseconds=batching["default_timeout_us"],
                    allow_timeout_override=True,
                    max_queue_size=batching["max_queue_size"],
                ),
            )
        )
    return pb.ModelConfigResponse(config=message)


def _data_type(tensor: Mapping[str, Any]) -> Any:
    datatype = str(tensor["datatype"])
    return pb.TYPE_STRING if datatype == "BYTES" else pb.DataType.Value(f"TYPE_{datatype}")


# -- statistics and repository ------------------------------------------------------------------


def statistics(stats: Mapping[str, Any]) -> Any:
    """ModelStatisticsResponse from DataPlane.statistics()."""
    return pb.ModelStatisticsResponse(model_stats=[_model_stats(s) for s in stats["model_stats"]])


def _model_stats(s: Mapping[str, Any]) -> Any:
    inference = s["inference_stats"]
    return pb.ModelStatistics(
        name=s["name"],
        version=s["version"],
        last_inference=s["last_inference"],
        inference_count=s["inference_count"],
        execution_count=s["execution_count"],
        inference_stats=pb.InferStatistics(
            **{key: _duration(inference[key]) for key in _INFER_STATS}
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b["batch_size"], compute_infer=_duration(b["compute_infer"])
            )
            for b in s["batch_stats"]
        ],
    )


_INFER_STATS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def _duration(d: Mapping[str, int]) -> Any:
    return pb.StatisticDuration(count=d["count"], ns=d["ns"])


def repository_index(rows: Iterable[Mapping[str, str]]) -> Any:
    """RepositoryIndexResponse from DataPlane.repository_index()."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=r["name"], version=r.get("version", ""), state=r["state"], reason=r["reason"]
            )
            for r in rows
        ]
    )


def load_done() -> Any:
    """RepositoryModelLoadResponse."""
    return pb.RepositoryModelLoadResponse()


def unload_done() -> Any:
    """RepositoryModelUnloadResponse."""
    return pb.RepositoryModelUnloadResponse()
