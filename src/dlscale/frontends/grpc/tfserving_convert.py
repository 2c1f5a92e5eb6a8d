"""TensorFlow Serving's gRPC messages to dlscale's types and back: the one module that touches
their protobuf (the `tensorflow-serving-api` package, which imports TensorFlow's protos).

A TensorProto's dtype must be the model input's own (TensorFlow Serving does not cast either);
its values come from `tensor_content` (raw, read without a copy) or the typed field of its dtype,
holding every element or one, which fills the shape (tf.make_tensor_proto's scalars). The shape
is checked against max_tensor_elements before any array is made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    predict_pb2,
    regression_pb2,
)

from dlscale.errors import InvalidInput, NotFound
from dlscale.frontends.tfserving.methods import Classes
from dlscale.frontends.tfserving.signature import (
    DATATYPES,
    DTYPES,
    PREDICT_METHOD,
    SERVING_DEFAULT,
    VersionStatus,
    version_number,
)
from dlscale.frontends.tfserving.values import spec_of
from dlscale.types import Datatype, InferenceResponse, ModelMetadata, TensorSpec
from dlscale.wire.bounds import check_shape
from dlscale.wire.tensors import RawData, WireTensor, Wording, as_bytes, read_tensor

SIGNATURE_DEF = "signature_def"
#: How tensor_content that does not fit its shape is worded.
WORDS = Wording(
    size="{role} {name!r} of shape {shape} and dtype {datatype} takes {want} bytes, but its "
    "tensor_content has {got}",
    overrun="",
    short="",
    trailing="",
)
#: The typed field of each datatype, and the numpy type protobuf holds its values in.
_FIELDS: dict[Datatype, tuple[str, Any]] = {
    Datatype.BOOL: ("bool_val", np.bool_),
    Datatype.UINT8: ("int_val", np.int32),
    Datatype.UINT16: ("int_val", np.int32),
    Datatype.INT8: ("int_val", np.int32),
    Datatype.INT16: ("int_val", np.int32),
    Datatype.INT32: ("int_val", np.int32),
    Datatype.UINT32: ("uint32_val", np.uint32),
    Datatype.UINT64: ("uint64_val", np.uint64),
    Datatype.INT64: ("int64_val", np.int64),
    Datatype.FP16: ("half_val", np.int32),  # bit patterns
    Datatype.BF16: ("half_val", np.int32),
    Datatype.FP32: ("float_val", np.float32),
    Datatype.FP64: ("double_val", np.float64),
    Datatype.BYTES: ("string_val", object),
}

# -- requests --------------------------------------------------------------------------------------


def model_spec(request: Any) -> tuple[str, str, str]:
    """(name, version, signature) of a request's ModelSpec; a version label is refused."""
    spec = request.model_spec
    if spec.WhichOneof("version_choice") == "version_label":
        raise NotFound(
            f"model {spec.name!r} has no version label {spec.version_label[:100]!r}: dlscale "
            "serves versions by number"
        )
    version = str(spec.version.value) if spec.HasField("version") else ""
    return spec.name, version, spec.signature_name


def predict_inputs(request: Any, meta: ModelMetadata, most: int) -> dict[str, np.ndarray]:
    """A PredictRequest's inputs as arrays of the model's datatypes."""
    return {
        name: to_array(proto, spec_of(meta, name), most) for name, proto in request.inputs.items()
    }


def to_array(proto: Any, spec: TensorSpec, most: int) -> np.ndarray:
    """One TensorProto as an array of input `spec`."""
    name, datatype = spec.name, spec.datatype
    given = (
        types_pb2.DataType.Name(proto.dtype) if proto.dtype in types_pb2.DataType.values() else "?"
    )
    if DATATYPES.get(given) is not datatype:
        raise InvalidInput(f"input {name!r} is {given}; the model takes {DTYPES[datatype]}")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    check_shape("input", name, shape, most)
    tensor = WireTensor("input", name, datatype, shape, {})
    if proto.tensor_content and datatype is not Datatype.BYTES:
        return read_tensor(tensor, RawData(proto.tensor_content, WORDS), most)
    field, wire = _FIELDS[datatype]
    values = getattr(proto, field)
    count = math.prod(shape)
    if len(values) not in (count, 1):
        raise InvalidInput(
            f"input {name!r}: {len(values)} values in {field}, but shape {list(shape)} holds "
            f"{count} (give each, or one for all)"
        )
    if datatype is Datatype.BYTES:
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
    else:
        array = np.array(values, dtype=wire)
        if datatype in (Datatype.FP16, Datatype.BF16):
            array = array.astype(np.uint16).view(datatype.numpy)
        elif array.dtype != datatype.numpy:
            narrowed = array.astype(datatype.numpy)
            if not np.array_equal(narrowed, array):
                raise InvalidInput(f"input {name!r}: values out of range for {DTYPES[datatype]}")
            array = narrowed
    return np.broadcast_to(array, shape).copy() if len(values) == 1 else array.reshape(shape)


def output_filter(request: Any) -> list[str]:
    """The outputs a PredictRequest asks for (empty: all)."""
    return list(request.output_filter)


def metadata_fields(request: Any) -> None:
    """InvalidInput unless a GetModelMetadataRequest asks for signature_def, the one field."""
    fields = list(request.metadata_field)
    if not fields:
        raise InvalidInput("GetModelMetadataRequest must name a metadata_field: signature_def")
    unknown = [f for f in fields if f != SIGNATURE_DEF]
    if unknown:
        raise InvalidInput(f"metadata_field {unknown[0][:100]!r} is not known; use signature_def")


def examples(request: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A Classify or Regress request's examples and context, feature name to values."""
    which = request.input.WhichOneof("kind")
    if which == "example_list":
        return [_features(e) for e in request.input.example_list.examples], {}
    if which == "example_list_with_context":
        given = request.input.example_list_with_context
        return [_features(e) for e in given.examples], _features(given.context)
    raise InvalidInput("the request's input holds no examples (example_list)")


def _features(example: Any) -> dict[str, Any]:
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = [] if kind is None else list(getattr(feature, kind).value)
    return out


# -- answers ---------------------------------------------------------------------------------------


def _spec(target: Any, name: str, version: str, signature: str = "") -> None:
    target.name = name
    if version.isdigit():
        target.version.value = version_number(version)
    target.signature_name = signature


def tensor_proto(array: np.ndarray) -> Any:
    """An array as a TensorProto (raw tensor_content; BYTES as string_val)."""
    datatype = Datatype.from_numpy(array.dtype)
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DataType.Value(DTYPES[datatype]))
    proto.tensor_shape.dim.extend(
        tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in array.shape
    )
    if datatype is Datatype.BYTES:
        proto.string_val.extend(as_bytes(x) for x in array.flat)
    else:
        proto.tensor_content = np.ascontiguousarray(array).tobytes()
    return proto


def predict_response(response: InferenceResponse, signature: str) -> Any:
    """A PredictResponse: every output, as TensorProto."""
    out = predict_pb2.PredictResponse()
    _spec(out.model_spec, response.model_name, response.model_version, signature or SERVING_DEFAULT)
    for name, array in response.outputs.items():
        out.outputs[name].CopyFrom(tensor_proto(array))
    return out


def classify_response(response: InferenceResponse, results: list[Classes]) -> Any:
    """A ClassificationResponse: one Classifications per example."""
    out = classification_pb2.ClassificationResponse()
    _spec(out.model_spec, response.model_name, response.model_version, SERVING_DEFAULT)
    for row in results:
        entry = out.result.classifications.add()
        entry.classes.extend(
            classification_pb2.Class(label=label, score=score) for label, score in row
        )
    return out


def regress_response(response: InferenceResponse, results: Sequence[float]) -> Any:
    """A RegressionResponse: one Regression per example."""
    out = regression_pb2.RegressionResponse()
    _spec(out.model_spec, response.model_name, response.model_version, SERVING_DEFAULT)
    out.result.regressions.extend(regression_pb2.Regression(value=v) for v in results)
    return out


def status_response(rows: Sequence[VersionStatus]) -> Any:
    """A GetModelStatusResponse."""
    out = get_model_status_pb2.GetModelStatusResponse()
    states = get_model_status_pb2.ModelVersionStatus.State
    for row in rows:
        entry = out.model_version_status.add(version=row.version, state=states.Value(row.state))
        entry.status.error_code = 0 if row.error_code == "OK" else 2  # tensorflow.error.UNKNOWN
        entry.status.error_message = row.error_message
    return out


def metadata_response(meta: ModelMetadata, version: str) -> Any:
    """A GetModelMetadataResponse whose signature_def holds `serving_default`."""
    out = get_model_metadata_pb2.GetModelMetadataResponse()
    _spec(out.model_spec, meta.name, version or (meta.versions[-1] if meta.versions else ""))
    signatures = get_model_metadata_pb2.SignatureDefMap()
    signature = signatures.signature_def[SERVING_DEFAULT]
    signature.method_name = PREDICT_METHOD
    _tensor_infos(signature.inputs, meta.inputs)
    _tensor_infos(signature.outputs, meta.outputs)
    out.metadata[SIGNATURE_DEF].Pack(signatures)
    return out


def _tensor_infos(target: Mapping[str, Any], specs: Sequence[TensorSpec]) -> None:
    for spec in specs:
        info: Any = target[spec.name]
        info.name = spec.name
        info.dtype = types_pb2.DataType.Value(DTYPES[spec.datatype])
        info.tensor_shape.dim.extend(
            tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in spec.shape
        )
