"""The committed gRPC stubs match the .proto, and the .proto matches what tritonclient speaks."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from dlscale.wire.proto.grpc_gen import inference_pb2

ROOT = Path(__file__).resolve().parents[3]
GEN_SCRIPT = ROOT / "scripts" / "gen_grpc.py"


def _gen_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_grpc", GEN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _without_version_stamps(text: str) -> str:
    # The generator's own version appears in the output; a newer grpcio-tools changes only these.
    text = re.sub(r"# Protobuf Python Version: .*\n", "", text)
    text = re.sub(r"_runtime_version\.ValidateProtobufRuntimeVersion\([^)]*\)\n", "", text)
    return re.sub(r"GRPC_GENERATED_VERSION = .*\n", "", text)


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) regenerates the stubs")
    gen = _gen_script()
    for fresh in gen.generate(tmp_path):
        committed = gen.GEN_DIR / fresh.name
        assert committed.exists(), f"{committed} is missing: run `make grpc-stubs`"
        assert _without_version_stamps(fresh.read_text()) == _without_version_stamps(
            committed.read_text()
        ), f"{committed.name} no longer matches inference.proto: run `make grpc-stubs`"


def test_committed_descriptor_is_the_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) compiles the .proto")
    gen = _gen_script()
    out = tmp_path / "set.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{gen.PROTO.parent}",
         f"--descriptor_set_out={out}", str(gen.PROTO)],
        check=True,
    )  # fmt: skip
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    _drop_json_names(compiled.message_type)  # protoc adds them to descriptor sets, not to stubs
    committed = descriptor_pb2.FileDescriptorProto()
    committed.ParseFromString(inference_pb2.DESCRIPTOR.serialized_pb)
    assert committed == compiled


def _drop_json_names(messages: Iterable[descriptor_pb2.DescriptorProto]) -> None:
    for message in messages:
        for field in message.field:
            field.ClearField("json_name")
        _drop_json_names(message.nested_type)


# -- wire compatibility with tritonclient -------------------------------------------------------

triton_service = pytest.importorskip("tritonclient.grpc.service_pb2")
triton_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _theirs(full_name: str) -> Descriptor:
    pool = triton_service.DESCRIPTOR.pool
    return pool.FindMessageTypeByName(full_name)


def _check_message(ours: Descriptor, theirs: Descriptor) -> None:
    for field in ours.fields:
        other = theirs.fields_by_name.get(field.name)
        where = f"{ours.full_name}.{field.name}"
        assert other is not None, f"{where}: not in tritonclient's {theirs.full_name}"
        assert field.number == other.number, f"{where}: number {field.number} != {other.number}"
        assert field.type == other.type, f"{where}: type {field.type} != {other.type}"
        assert (field.label == FieldDescriptor.LABEL_REPEATED) == (
            other.label == FieldDescriptor.LABEL_REPEATED
        ), f"{where}: repeated differs"
        ours_oneof = field.containing_oneof.name if field.containing_oneof else None
        theirs_oneof = other.containing_oneof.name if other.containing_oneof else None
        assert ours_oneof == theirs_oneof, f"{where}: oneof {ours_oneof} != {theirs_oneof}"
        if field.message_type is not None:
            assert field.message_type.full_name == other.message_type.full_name, where
            _check_message(field.message_type, other.message_type)
        if field.enum_type is not None:
            assert field.enum_type.full_name == other.enum_type.full_name, where
            _check_enum(field.enum_type, other.enum_type)


def _check_enum(ours: EnumDescriptor, theirs: EnumDescriptor) -> None:
    for value in ours.values:
        assert theirs.values_by_name[value.name].number == value.number, (
            f"{ours.full_name}.{value.name}"
        )


@pytest.mark.parametrize("name", sorted(inference_pb2.DESCRIPTOR.message_types_by_name))
def test_message_fields_match_tritonclient(name: str) -> None:
    ours = inference_pb2.DESCRIPTOR.message_types_by_name[name]
    _check_message(ours, _theirs(ours.full_name))


def test_service_matches_tritonclient() -> None:
    ours = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = triton_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    for method in ours.methods:
        other = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == other.input_type.full_name, method.name
        assert method.output_type.full_name == other.output_type.full_name, method.name
        assert method.client_streaming == other.client_streaming, method.name
        assert method.server_streaming == other.server_streaming, method.name
    assert {m.name for m in ours.methods} >= {
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
        "ModelInfer", "ModelStreamInfer", "ModelConfig", "ModelStatistics",
        "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload",
    }  # fmt: skip


def test_messages_live_outside_the_default_pool() -> None:
    # tritonclient registers the same names in the default pool; ours must not collide with it.
    assert inference_pb2.DESCRIPTOR.pool is not triton_service.DESCRIPTOR.pool
    request = inference_pb2.ModelInferRequest(model_name="m", raw_input_contents=[b"\x00" * 4])
    request.parameters["priority"].uint64_param = 2
    theirs = triton_service.ModelInferRequest.FromString(request.SerializeToString())
    assert theirs.model_name == "m" and theirs.parameters["priority"].uint64_param == 2
    assert theirs.raw_input_contents == [b"\x00" * 4]
