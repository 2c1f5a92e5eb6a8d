"""The few Open Inference Protocol gRPC messages the bench client needs, built at run time.

The messages are declared here as data (names, field numbers, types copied from the published
`open_inference_grpc.proto`) and compiled into a private descriptor pool, so the bench needs
neither protoc at install time nor the server's generated stubs (bench must not import
frontends), and never clashes with another `inference.*` module in the default pool.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "bool": _F.TYPE_BOOL,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "uint32": _F.TYPE_UINT32,
    "uint64": _F.TYPE_UINT64,
    "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
}

#: (field name, number, type, "repeated" | "map" | "" | "oneof:<name>").
_Field = tuple[str, int, str, str]
_TENSOR_META: list[_Field] = [
    ("name", 1, "string", ""),
    ("datatype", 2, "string", ""),
    ("shape", 3, "int64", "repeated"),
]
_MESSAGES: dict[str, list[_Field]] = {
    "InferParameter": [
        ("bool_param", 1, "bool", "oneof:parameter_choice"),
        ("int64_param", 2, "int64", "oneof:parameter_choice"),
        ("string_param", 3, "string", "oneof:parameter_choice"),
        ("double_param", 4, "double", "oneof:parameter_choice"),
        ("uint64_param", 5, "uint64", "oneof:parameter_choice"),
    ],
    "InferTensorContents": [
        ("bool_contents", 1, "bool", "repeated"),
        ("int_contents", 2, "int32", "repeated"),
        ("int64_contents", 3, "int64", "repeated"),
        ("uint_contents", 4, "uint32", "repeated"),
        ("uint64_contents", 5, "uint64", "repeated"),
        ("fp32_contents", 6, "float", "repeated"),
        ("fp64_contents", 7, "double", "repeated"),
        ("bytes_contents", 8, "bytes", "repeated"),
    ],
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, "bool", "")],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool", "")],
    "ModelReadyRequest": [("name", 1, "string", ""), ("version", 2, "string", "")],
    "ModelReadyResponse": [("ready", 1, "bool", "")],
    "ModelMetadataRequest": [("name", 1, "string", ""), ("version", 2, "string", "")],
    "ModelMetadataResponse.TensorMetadata": _TENSOR_META,
    "ModelMetadataResponse": [
        ("name", 1, "string", ""),
        ("versions", 2, "string", "repeated"),
        ("platform", 3, "string", ""),
        ("inputs", 4, ".inference.ModelMetadataResponse.TensorMetadata", "repeated"),
        ("outputs", 5, ".inference.ModelMetadataResponse.TensorMetadata", "repeated"),
    ],
    "ModelInferRequest.InferInputTensor": [
        *_TENSOR_META,
        ("parameters", 4, ".inference.InferParameter", "map"),
        ("contents", 5, ".inference.InferTensorContents", ""),
    ],
    "ModelInferRequest.InferRequestedOutputTensor": [
        ("name", 1, "string", ""),
        ("parameters", 2, ".inference.InferParameter", "map"),
    ],
    "ModelInferRequest": [
        ("model_name", 1, "string", ""),
        ("model_version", 2, "string", ""),
        ("id", 3, "string", ""),
        ("parameters", 4, ".inference.InferParameter", "map"),
        ("inputs", 5, ".inference.ModelInferRequest.InferInputTensor", "repeated"),
        ("outputs", 6, ".inference.ModelInferRequest.InferRequestedOutputTensor", "repeated"),
        ("raw_input_contents", 7, "bytes", "repeated"),
    ],
    "ModelInferResponse.InferOutputTensor": [
        *_TENSOR_META,
        ("parameters", 4, ".inference.InferParameter", "map"),
        ("contents", 5, ".inference.InferTensorContents", ""),
    ],
    "ModelInferResponse": [
        ("model_name", 1, "string", ""),
        ("model_version", 2, "string", ""),
        ("id", 3, "string", ""),
        ("parameters", 4, ".inference.InferParameter", "map"),
        ("outputs", 5, ".inference.ModelInferResponse.InferOutputTensor", "repeated"),
        ("raw_output_contents", 6, "bytes", "repeated"),
    ],
}

#: The gRPC service every OIP server implements.
SERVICE = "inference.GRPCInferenceService"


def _add_fields(msg: descriptor_pb2.DescriptorProto, fields: list[_Field]) -> None:
    oneofs: dict[str, int] = {}
    for name, number, kind, mode in fields:
        field = msg.field.add(name=name, number=number)
        if mode == "map":
            # A map is a repeated nested `<Name>Entry {key = 1; value = 2}` flagged map_entry.
            entry = msg.nested_type.add(name="".join(p.title() for p in name.split("_")) + "Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
            entry.field.add(
                name="value",
                number=2,
                type=_F.TYPE_MESSAGE,
                type_name=kind,
                label=_F.LABEL_OPTIONAL,
            )
            field.type = _F.TYPE_MESSAGE
            field.type_name = f"{entry.name}"
            field.label = _F.LABEL_REPEATED
            continue
        if kind in _SCALARS:
            field.type = _SCALARS[kind]
        else:
            field.type = _F.TYPE_MESSAGE
            field.type_name = kind
        field.label = _F.LABEL_REPEATED if mode == "repeated" else _F.LABEL_OPTIONAL
        if mode.startswith("oneof:"):
            group = mode.split(":", 1)[1]
            if group not in oneofs:
                oneofs[group] = len(msg.oneof_decl)
                msg.oneof_decl.add(name=group)
            field.oneof_index = oneofs[group]


def _build() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(
        name="dlscale_bench_oip.proto", package="inference", syntax="proto3"
    )
    tops: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full, fields in _MESSAGES.items():
        outer, _, inner = full.partition(".")
        if outer not in tops:
            tops[outer] = file.message_type.add(name=outer)
        target = tops[outer].nested_type.add(name=inner) if inner else tops[outer]
        _add_fields(target, fields)
        # Map entry type names are relative to the message that declares them.
        prefix = f".inference.{full}."
        for field in target.field:
            if field.type_name and not field.type_name.startswith("."):
                field.type_name = prefix + field.type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        full: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{full}"))
        for full in _MESSAGES
    }


_CLASSES = _build()

InferParameter: Any = _CLASSES["InferParameter"]
InferTensorContents: Any = _CLASSES["InferTensorContents"]
ServerLiveRequest: Any = _CLASSES["ServerLiveRequest"]
ServerLiveResponse: Any = _CLASSES["ServerLiveResponse"]
ServerReadyRequest: Any = _CLASSES["ServerReadyRequest"]
ServerReadyResponse: Any = _CLASSES["ServerReadyResponse"]
ModelReadyRequest: Any = _CLASSES["ModelReadyRequest"]
ModelReadyResponse: Any = _CLASSES["ModelReadyResponse"]
ModelMetadataRequest: Any = _CLASSES["ModelMetadataRequest"]
ModelMetadataResponse: Any = _CLASSES["ModelMetadataResponse"]
ModelInferRequest: Any = _CLASSES["ModelInferRequest"]
ModelInferResponse: Any = _CLASSES["ModelInferResponse"]
