"""A served model's config as the protocol shows it (Triton's layout), typed for both frontends."""

from __future__ import annotations

from dlscale.models.config import InstanceConfig, ModelConfig
from dlscale.models.config import VersionPolicy as VersionPolicyConfig
from dlscale.serving.served import ServedVersion
from dlscale.types import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    InstanceKind,
    ModelConfigView,
    TensorSpec,
    VersionPolicy,
    cuda_index,
    is_mig,
)


def config_view(served: ServedVersion) -> ModelConfigView:
    """The config a version is served with; its tensors are the served signature's. A pipeline
    shows as Triton shows an ensemble: no backend, instances, batching or files of its own."""
    config = served.config
    skip = 1 if config.batched else 0  # the protocol's dims leave out the batch dimension
    own = not config.is_pipeline  # what a model of its own shows and a pipeline leaves out
    groups = enumerate(config.instances if own else ())
    return ModelConfigView(
        name=config.name,
        platform=config.platform_name,
        backend=config.backend if own else "",
        max_batch_size=config.max_batch_size,
        inputs=tuple(_without_batch(s, skip) for s in served.inputs),
        outputs=tuple(_without_batch(s, skip) for s in served.outputs),
        version_policy=_version_policy(config.version_policy),
        dynamic_batching=_batching(config) if own and config.batched else None,
        instance_groups=tuple(_instance_group(config.name, i, group) for i, group in groups),
        parameters=_parameters(config),
        label_files={t.name: t.label_file for t in config.outputs or () if own and t.label_file},
        default_model_filename=served.version.model_file.name if own else "",
        decoupled=served.runner.kind.streams,
        response_cache=config.response_cache,  # a pipeline's answers are cached too
        ensemble_steps=tuple(
            EnsembleStep(s.model, s.version or -1, s.input_map, s.output_map)
            for s in config.steps or ()
        ),
    )


def _parameters(config: ModelConfig) -> dict[str, str]:
    """[metadata], and the engine's max_model_len where [backend_options] sets it: the
    context a generative model serves, as /v1/models reports it."""
    parameters = {k: str(v) for k, v in config.metadata.items()}
    length = (config.backend_options.model_extra or {}).get("max_model_len")
    if length is not None:
        parameters["max_model_len"] = str(length)
    if config.is_adapter:  # a LoRA adapter's base model (/v1/models' `parent`, as vLLM's)
        parameters["base"] = config.base
    return parameters


def _without_batch(spec: TensorSpec, skip: int) -> TensorSpec:
    return TensorSpec(spec.name, spec.datatype, spec.shape[skip:])


def _version_policy(policy: VersionPolicyConfig) -> VersionPolicy:
    if policy.all:
        return VersionPolicy(all_versions=True)
    if policy.specific is not None:
        return VersionPolicy(specific=tuple(policy.specific))
    return VersionPolicy(latest=policy.latest or 1)


def _batching(config: ModelConfig) -> DynamicBatching:
    b = config.batching
    return DynamicBatching(
        max_queue_delay_us=b.max_queue_delay_us,
        preferred_batch_sizes=tuple(b.preferred_batch_sizes),
        priority_levels=b.priority_levels,
        default_priority_level=b.default_priority_level,
        max_queue_size=b.max_queue_size,
        default_timeout_us=b.default_timeout_us,
    )


def _instance_group(model: str, index: int, group: InstanceConfig) -> InstanceGroup:
    gpu = cuda_index(group.device)  # a MIG instance names no index
    if gpu is None and not is_mig(group.device):
        return InstanceGroup(f"{model}_{index}", group.count, InstanceKind.CPU)
    gpus = () if gpu is None else (gpu,)
    return InstanceGroup(f"{model}_{index}", group.count, InstanceKind.GPU, gpus)
