"""The DataPlane's typed answers as gRPC messages, and the fields the servicer reads from requests.

Inference messages are the wire codec's (`dlscale.wire.grpc`); this module adds what only the
server says: health, metadata, config, statistics, the repository, and in-stream errors.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import InvalidInput
from dlscale.types import (
    DynamicBatching,
    InferenceResponse,
    InstanceGroup,
    ModelConfigView,
    ModelMetadata,
    ModelStatistics,
    RepositoryEntry,
    ServerMetadata,
    StatDuration,
    TensorSpec,
    VersionPolicy,
)
from dlscale.wire.grpc import Framed, frame_infer_response
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

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


def load_parameters(message: Any) -> dict[str, Any]:
    """A RepositoryModelLoad request's parameters as plain values (files are bytes)."""
    out = {}
    for key, value in message.parameters.items():
        which = value.WhichOneof("parameter_choice")
        if which is None:
            raise InvalidInput(f"load parameter {key!r} has no value")
        out[key] = getattr(value, which)
    return out


def trace_changes(message: Any) -> tuple[str, dict[str, Any]]:
    """A TraceSetting request: the model (empty: server-wide) and the settings to change; a
    setting with no value is cleared (None), one value is a string, several a list."""
    changes: dict[str, Any] = {}
    for key, setting in message.settings.items():
        values = list(setting.value)
        changes[key] = None if not values else values if key == "trace_level" else values[0]
    return message.model_name, changes


def trace_settings(settings: dict[str, str | list[str]]) -> Any:
    """TraceSettingResponse."""
    response = pb.TraceSettingResponse()
    for key, value in settings.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [value])
    return response


def log_changes(message: Any) -> dict[str, Any]:
    """A LogSettings request's settings as plain values."""
    out: dict[str, Any] = {}
    for key, value in message.settings.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = None if which is None else getattr(value, which)
    return out


def log_settings(settings: dict[str, str | bool | int]) -> Any:
    """LogSettingsResponse."""
    response = pb.LogSettingsResponse()
    for key, value in settings.items():
        slot = response.settings[key]
        if isinstance(value, bool):
            slot.bool_param = value
        elif isinstance(value, int):
            slot.uint32_param = value
        else:
            slot.string_param = value
    return response


# -- inference ----------------------------------------------------------------------------------


def infer_response(response: InferenceResponse, raw: bool, max_bytes: int) -> Framed:
    """A ModelInferResponse, raw outputs beside it (the frontend's serializer joins them once,
    wrapped as a ModelStreamInferResponse's answer on a stream)."""
    return frame_infer_response(response, raw, max_bytes)


def stream_error(text: str, message: Any) -> Any:
    """An in-stream error for a ModelInferRequest; its id ties the error to the request."""
    echo = pb.ModelInferResponse(
        model_name=message.model_name, model_version=message.model_version, id=message.id
    )
    return pb.ModelStreamInferResponse(error_message=text, infer_response=echo)


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


def server_metadata(meta: ServerMetadata) -> Any:
    """ServerMetadataResponse."""
    return pb.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=meta.extensions
    )


def model_metadata(meta: ModelMetadata) -> Any:
    """ModelMetadataResponse."""
    return pb.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions,
        platform=meta.platform,
        inputs=[_tensor_metadata(t) for t in meta.inputs],
        outputs=[_tensor_metadata(t) for t in meta.outputs],
    )


def _tensor_metadata(spec: TensorSpec) -> Any:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=spec.name, datatype=spec.datatype.value, shape=spec.shape
    )


def model_config(view: ModelConfigView) -> Any:
    """ModelConfigResponse in Triton's layout."""
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
        parameters={k: pb.ModelParameter(string_value=v) for k, v in view.parameters.items()},
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
    return pb.ModelConfigResponse(config=message)


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


# -- statistics and repository ------------------------------------------------------------------


def statistics(stats: list[ModelStatistics]) -> Any:
    """ModelStatisticsResponse."""
    return pb.ModelStatisticsResponse(model_stats=[_model_stats(s) for s in stats])


def _model_stats(s: ModelStatistics) -> Any:
    inference = s.inference_stats
    return pb.ModelStatistics(
        name=s.name,
        version=s.version,
        last_inference=s.last_inference_ms,
        inference_count=s.inference_count,
        execution_count=s.execution_count,
        inference_stats=pb.InferStatistics(
            success=_duration(inference.success),
            fail=_duration(inference.fail),
            queue=_duration(inference.queue),
            compute_input=_duration(inference.compute_input),
            compute_infer=_duration(inference.compute_infer),
            compute_output=_duration(inference.compute_output),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=b.batch_size,
                compute_input=_duration(b.compute_input),
                compute_infer=_duration(b.compute_infer),
                compute_output=_duration(b.compute_output),
            )
            for b in s.batch_stats
        ],
    )


def _duration(d: StatDuration) -> Any:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def repository_index(rows: list[RepositoryEntry]) -> Any:
    """RepositoryIndexResponse."""
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=r.name, version=r.version, state=r.state, reason=r.reason
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
