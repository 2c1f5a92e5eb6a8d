"""Triton's ModelConfig and ModelStatistics, built once as the gRPC schema's messages.

gRPC answers with the messages; REST answers with their JSON form (`as_document`), as Triton
prints them: every field of the schema with its value, enums by name, 64-bit integers as
numbers. One builder keeps the two protocols' documents from drifting apart and gives clients
the whole schema (`optimization`, `model_transaction_policy`, `response_cache`, ...), not a
subset that a reader of Triton's keys would trip on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict

from dlscale.types import (
    BatchStats,
    DynamicBatching,
    InferStats,
    InstanceGroup,
    ModelConfigView,
    ModelStatistics,
    StatDuration,
    TensorSpec,
    VersionPolicy,
)
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def as_document(message: Any) -> dict[str, Any]:
    """A message as Triton's REST JSON: proto field names, every field, integers as numbers."""
    doc: dict[str, Any] = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(doc, message.DESCRIPTOR)


def _numbers(doc: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    # protobuf's JSON mapping writes 64-bit integers as strings; Triton writes numbers.
    for field in descriptor.fields:
        if field.name not in doc:
            continue
        value = doc[field.name]
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                entry = field.message_type.fields_by_name["value"]
                if entry.message_type is not None:
                    doc[field.name] = {k: _numbers(v, entry.message_type) for k, v in value.items()}
            elif isinstance(value, list):
                doc[field.name] = [_numbers(v, field.message_type) for v in value]
            else:
                doc[field.name] = _numbers(value, field.message_type)
        elif field.type in _INT64:
            doc[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return doc


# -- config -------------------------------------------------------------------------------------


def config_message(view: ModelConfigView) -> Any:
    """The ModelConfig a served version answers with, in Triton's layout."""
    message = pb.ModelConfig(
        name=view.name,
        platform=view.platform,
        backend=view.backend,
        version_policy=_version_policy(view.version_policy),
        max_batch_size=view.max_batch_size,
        input=[
            pb.ModelInput(name=s.name, data_type=_data_type(s), dims=s.shape) for s in view.inputs
        ],
        output=[
            pb.ModelOutput(
                name=s.name,
                data_type=_data_type(s),
                dims=s.shape,
                label_filename=view.label_files.get(s.name, ""),
            )
            for s in view.outputs
        ],
        instance_group=[_instance_group(g) for g in view.instance_groups],
        default_model_filename=view.default_model_filename,
        parameters={k: pb.ModelParameter(string_value=v) for k, v in view.parameters.items()},
        # What is true of dlscale: host buffers are reused (Triton's pinned-memory defaults), one
        # request gets one response, and a cache answers only where the config enables it.
        optimization=pb.ModelOptimizationPolicy(
            input_pinned_memory=pb.ModelOptimizationPolicy.PinnedMemoryBuffer(enable=True),
            output_pinned_memory=pb.ModelOptimizationPolicy.PinnedMemoryBuffer(enable=True),
        ),
        model_transaction_policy=pb.ModelTransactionPolicy(decoupled=view.decoupled),
        response_cache=pb.ModelResponseCache(enable=view.response_cache),
    )
    if view.dynamic_batching is not None:
        message.dynamic_batching.CopyFrom(_dynamic_batching(view.dynamic_batching))
    for step in view.ensemble_steps:
        message.ensemble_scheduling.step.add(
            model_name=step.model_name,
            model_version=step.model_version,
            input_map=dict(step.input_map),
            output_map=dict(step.output_map),
        )
    return message


def _data_type(spec: TensorSpec) -> Any:
    return pb.DataType.Value(spec.datatype.config_type)


def _version_policy(policy: VersionPolicy) -> Any:
    if policy.all_versions:
        return pb.ModelVersionPolicy(all=pb.ModelVersionPolicy.All())
    if policy.specific is not None:
        return pb.ModelVersionPolicy(
            specific=pb.ModelVersionPolicy.Specific(versions=policy.specific)
        )
    return pb.ModelVersionPolicy(latest=pb.ModelVersionPolicy.Latest(num_versions=policy.latest))


def _instance_group(group: InstanceGroup) -> Any:
    return pb.ModelInstanceGroup(
        name=group.name,
        count=group.count,
        kind=pb.ModelInstanceGroup.Kind.Value(group.kind.value),
        gpus=group.gpus,
    )


def _dynamic_batching(b: DynamicBatching) -> Any:
    return pb.ModelDynamicBatching(
        preferred_batch_size=b.preferred_batch_sizes,
        max_queue_delay_microseconds=b.max_queue_delay_us,
        priority_levels=b.priority_levels,
        default_priority_level=b.default_priority_level,
        default_queue_policy=pb.ModelQueuePolicy(
            default_timeout_microseconds=b.default_timeout_us,
            allow_timeout_override=True,
            max_queue_size=b.max_queue_size,
        ),
    )


# -- statistics ---------------------------------------------------------------------------------


def statistics_message(stats: list[ModelStatistics]) -> Any:
    """ModelStatisticsResponse for the given versions."""
    return pb.ModelStatisticsResponse(model_stats=[_model_stats(s) for s in stats])


def _model_stats(s: ModelStatistics) -> Any:
    return pb.ModelStatistics(
        name=s.name,
        version=s.version,
        last_inference=s.last_inference_ms,
        inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(**_durations(s.inference_stats)),
        batch_stats=[
            pb.InferBatchStatistics(batch_size=b.batch_size, **_durations(b)) for b in s.batch_stats
        ],
    )


def _durations(stats: InferStats | BatchStats) -> dict[str, Any]:
    """Each StatDuration of `stats` as the schema's StatisticDuration of the same name."""
    return {
        f.name: pb.StatisticDuration(count=value.count, ns=value.ns)
        for f in dataclasses.fields(stats)
        if isinstance(value := getattr(stats, f.name), StatDuration)
    }
