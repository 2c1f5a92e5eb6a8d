"""The gRPC rendering of the DataPlane's typed answers: config, statistics, index, streams."""

from __future__ import annotations

import numpy as np
from google.protobuf import json_format

from dlscale.frontends.grpc import convert
from dlscale.frontends.grpc.frontend import write_stream_answer
from dlscale.frontends.rest import render
from dlscale.types import (
    BatchStats,
    Datatype,
    DynamicBatching,
    InferenceResponse,
    InferStats,
    InstanceGroup,
    InstanceKind,
    ModelConfigView,
    ModelStatistics,
    RepositoryEntry,
    StatDuration,
    TensorSpec,
    VersionPolicy,
)
from dlscale.wire.documents import statistics_message
from dlscale.wire.grpc import frame_infer_response
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

CONFIG = ModelConfigView(
    name="m",
    platform="onnxruntime_onnx",
    backend="onnxruntime",
    max_batch_size=8,
    inputs=(TensorSpec("x", Datatype.BYTES, (3,)),),
    outputs=(TensorSpec("y", Datatype.BF16, (3, 4)),),
    version_policy=VersionPolicy(specific=(1, 3)),
    dynamic_batching=DynamicBatching(
        max_queue_delay_us=100,
        preferred_batch_sizes=(4, 8),
        priority_levels=2,
        default_priority_level=2,
        max_queue_size=10,
        default_timeout_us=0,
    ),
    instance_groups=(
        InstanceGroup("m_0", 2, InstanceKind.GPU, (1,)),
        InstanceGroup("m_1", 1, InstanceKind.CPU),
    ),
    parameters={"owner": "me", "rank": "3"},
)


def test_model_config_layout() -> None:
    got = convert.model_config(CONFIG).config
    assert got.max_batch_size == 8 and got.platform == "onnxruntime_onnx"
    assert got.input[0].data_type == pb.TYPE_STRING and list(got.input[0].dims) == [3]
    assert got.output[0].data_type == pb.TYPE_BF16 and list(got.output[0].dims) == [3, 4]
    assert list(got.dynamic_batching.preferred_batch_size) == [4, 8]
    assert got.dynamic_batching.default_queue_policy.max_queue_size == 10
    kinds = [(g.kind, list(g.gpus), g.count) for g in got.instance_group]
    assert kinds == [
        (pb.ModelInstanceGroup.KIND_GPU, [1], 2),
        (pb.ModelInstanceGroup.KIND_CPU, [], 1),
    ]
    assert got.parameters["rank"].string_value == "3"
    assert list(got.version_policy.specific.versions) == [1, 3]
    unbatched = ModelConfigView("u", "p", "torch", 0, (), (), VersionPolicy(latest=2), None, (), {})
    message = convert.model_config(unbatched).config
    assert not message.HasField("dynamic_batching")
    assert message.version_policy.latest.num_versions == 2


def test_rest_and_grpc_render_the_same_config() -> None:
    # The REST JSON is the JSON form of the gRPC message: parsed back, the two are equal.
    for view in (
        CONFIG,
        ModelConfigView("u", "p", "b", 0, (), (), VersionPolicy(all_versions=True), None, (), {}),
    ):
        parsed = json_format.ParseDict(render.model_config(view), pb.ModelConfig())
        assert parsed == convert.model_config(view).config


STATS = ModelStatistics(
    name="m",
    version="1",
    last_inference_ms=123,
    inference_count=5,
    execution_count=2,
    inference_stats=InferStats(*[StatDuration(2, 1000)] * 6),
    batch_stats=(BatchStats(4, StatDuration(2, 10), StatDuration(2, 1000), StatDuration(2, 30)),),
)


def test_statistics_layout() -> None:
    got = statistics_message([STATS]).model_stats[0]
    assert (got.name, got.version, got.inference_count, got.execution_count) == ("m", "1", 5, 2)
    assert got.inference_stats.queue.ns == 1000
    assert got.batch_stats[0].batch_size == 4 and got.batch_stats[0].compute_infer.count == 2
    assert (got.batch_stats[0].compute_input.ns, got.batch_stats[0].compute_output.ns) == (10, 30)
    assert got.last_inference == 123
    parsed = json_format.ParseDict(render.statistics([STATS]), pb.ModelStatisticsResponse())
    assert parsed == statistics_message([STATS])


def test_repository_index_rows() -> None:
    rows = [RepositoryEntry("a", "READY", "", "2"), RepositoryEntry("b", "UNAVAILABLE", "bad")]
    got = convert.repository_index(rows).models
    assert [(m.name, m.version, m.state) for m in got] == [
        ("a", "2", "READY"),
        ("b", "", "UNAVAILABLE"),
    ]
    assert render.repository_index(rows) == [
        {"name": "a", "state": "READY", "reason": "", "version": "2"},
        {"name": "b", "state": "UNAVAILABLE", "reason": "bad"},
    ]


def test_stream_answers_and_errors() -> None:
    response = InferenceResponse("m", {"y": np.zeros(2, np.float32)}, id="7")
    framed = frame_infer_response(response, raw=True, max_bytes=2**20)
    # The stream's serializer wraps the answer's bytes without re-encoding it.
    wrapped = pb.ModelStreamInferResponse.FromString(write_stream_answer(framed))
    assert wrapped.infer_response.id == "7" and len(wrapped.infer_response.raw_output_contents) == 1
    assert wrapped.infer_response.raw_output_contents[0] == bytes(8)
    request = pb.ModelInferRequest(model_name="m", model_version="1", id="8")
    error = convert.stream_error("bad", request)
    assert error.error_message == "bad" and error.infer_response.id == "8"
    again = pb.ModelStreamInferResponse.FromString(write_stream_answer(error))
    assert again == error
