"""The DataPlane's typed answers as the REST protocol's JSON documents (Triton's layouts)."""

from __future__ import annotations

from typing import Any

from dlscale.types import (
    DynamicBatching,
    EnsembleStep,
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


def server_metadata(meta: ServerMetadata) -> dict[str, Any]:
    """`GET /v2`: `{name, version, extensions}`."""
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    """`GET /v2/models/{m}`: `{name, versions, platform, inputs, outputs}`."""
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [s.to_dict() for s in meta.inputs],
        "outputs": [s.to_dict() for s in meta.outputs],
    }


def model_config(view: ModelConfigView) -> dict[str, Any]:
    """`GET /v2/models/{m}/config`: the JSON form of Triton's ModelConfig message."""
    doc: dict[str, Any] = {
        "name": view.name,
        "platform": view.platform,
        "backend": view.backend,
        "version_policy": _version_policy(view.version_policy),
        "max_batch_size": view.max_batch_size,
        "input": [_config_tensor(s) for s in view.inputs],
        "output": [
            {**_config_tensor(s), **_label(view.label_files.get(s.name))} for s in view.outputs
        ],
        "instance_group": [_instance_group(g) for g in view.instance_groups],
        "parameters": {k: {"string_value": v} for k, v in view.parameters.items()},
    }
    if view.dynamic_batching is not None:
        doc["dynamic_batching"] = _dynamic_batching(view.dynamic_batching)
    if view.ensemble_steps:
        doc["ensemble_scheduling"] = {"step": [_step(s) for s in view.ensemble_steps]}
    return doc


def _step(step: EnsembleStep) -> dict[str, Any]:
    return {
        "model_name": step.model_name,
        "model_version": step.model_version,
        "input_map": dict(step.input_map),
        "output_map": dict(step.output_map),
    }


def _config_tensor(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "data_type": spec.datatype.config_type, "dims": list(spec.shape)}


def _label(file: str | None) -> dict[str, str]:
    return {"label_filename": file} if file else {}


def _version_policy(policy: VersionPolicy) -> dict[str, Any]:
    if policy.all_versions:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": list(policy.specific)}}
    return {"latest": {"num_versions": policy.latest}}


def _instance_group(group: InstanceGroup) -> dict[str, Any]:
    return {
        "name": group.name,
        "kind": group.kind.value,
        "count": group.count,
        "gpus": list(group.gpus),
    }


def _dynamic_batching(b: DynamicBatching) -> dict[str, Any]:
    return {
        "preferred_batch_size": list(b.preferred_batch_sizes),
        "max_queue_delay_microseconds": b.max_queue_delay_us,
        "priority_levels": b.priority_levels,
        "default_priority_level": b.default_priority_level,
        "default_queue_policy": {
            "default_timeout_microseconds": b.default_timeout_us,
            "allow_timeout_override": True,
            "max_queue_size": b.max_queue_size,
        },
    }


def statistics(stats: list[ModelStatistics]) -> dict[str, Any]:
    """`GET /v2/models[/{m}]/stats`: Triton's statistics extension."""
    return {"model_stats": [_model_stats(s) for s in stats]}


def _model_stats(s: ModelStatistics) -> dict[str, Any]:
    inference = s.inference_stats
    return {
        "name": s.name,
        "version": s.version,
        "last_inference": s.last_inference_ms,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration(inference.success),
            "fail": _duration(inference.fail),
            "queue": _duration(inference.queue),
            "compute_input": _duration(inference.compute_input),
            "compute_infer": _duration(inference.compute_infer),
            "compute_output": _duration(inference.compute_output),
        },
        "batch_stats": [
            {
                "batch_size": b.batch_size,
                "compute_input": _duration(b.compute_input),
                "compute_infer": _duration(b.compute_infer),
                "compute_output": _duration(b.compute_output),
            }
            for b in s.batch_stats
        ],
    }


def _duration(d: StatDuration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def repository_index(rows: list[RepositoryEntry]) -> list[dict[str, str]]:
    """`POST /v2/repository/index`: one row per version; no `version` for a model with none."""
    out = []
    for row in rows:
        doc = {"name": row.name, "state": row.state, "reason": row.reason}
        if row.version:
            doc["version"] = row.version
        out.append(doc)
    return out
