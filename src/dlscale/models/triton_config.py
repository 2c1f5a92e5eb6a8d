"""Triton's model configuration as dlscale's: config.pbtxt, or the JSON a load request carries.

Both parse into the gRPC schema's ModelConfig, which holds every field of Triton's
model_config.proto (docs/decisions.md says why), so a field dlscale does not act on is named in
one warning instead of being refused or silently dropped. The mapping is written once, here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.message import Message

from dlscale.backends import RUNTIMES
from dlscale.backends.python.autocomplete import CLASS, METHOD, auto_complete
from dlscale.backends.python.backend import ISOLATION_PARAMETER
from dlscale.backends.python.source import defines_method
from dlscale.errors import ConfigError
from dlscale.models.config import (
    ModelConfig,
    check_name,
    config_text,
    newest_file,
    parse_config,
)
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

#: Digits a count in a config parameter may have (thread counts; the host bounds the value).
MAX_COUNT_DIGITS = 9

#: Triton's platform and backend names -> dlscale's backend (the backend table's `triton_names`).
BACKENDS = {alias: name for name, runtime in RUNTIMES.items() for alias in runtime.triton_names}
#: A config.pbtxt parameter that bounds a Python model's worker memory (max_worker_memory_mb).
PYTHON_MEMORY = "DLSCALE_MAX_WORKER_MEMORY_MB"
#: Triton's ONNX Runtime parameters that are dlscale backend options.
ORT_PARAMETERS = {
    "intra_op_thread_count": "intra_op_threads",
    "inter_op_thread_count": "inter_op_threads",
}

#: The fields of Triton's ModelConfig that dlscale acts on, as paths without indices.
SUPPORTED = frozenset(
    {
        "name", "platform", "backend", "max_batch_size", "default_model_filename", "parameters",
        "input", "input.name", "input.data_type", "input.dims",
        "output", "output.name", "output.data_type", "output.dims", "output.label_filename",
        "version_policy", "version_policy.latest", "version_policy.latest.num_versions",
        "version_policy.all", "version_policy.specific", "version_policy.specific.versions",
        "dynamic_batching", "dynamic_batching.preferred_batch_size",
        "dynamic_batching.max_queue_delay_microseconds", "dynamic_batching.priority_levels",
        "dynamic_batching.default_priority_level", "dynamic_batching.default_queue_policy",
        "dynamic_batching.default_queue_policy.default_timeout_microseconds",
        "dynamic_batching.default_queue_policy.allow_timeout_override",
        "dynamic_batching.default_queue_policy.max_queue_size",
        "instance_group", "instance_group.name", "instance_group.count", "instance_group.kind",
        "instance_group.gpus", "response_cache", "response_cache.enable",
        "model_warmup", "model_warmup.name", "model_warmup.batch_size", "model_warmup.count",
        "model_warmup.inputs", "model_warmup.inputs.key", "model_warmup.inputs.value",
        "model_warmup.inputs.value.data_type", "model_warmup.inputs.value.dims",
        "model_warmup.inputs.value.zero_data", "model_warmup.inputs.value.random_data",
        "model_warmup.inputs.value.input_data_file",
        "ensemble_scheduling", "ensemble_scheduling.step", "ensemble_scheduling.step.model_name",
        "ensemble_scheduling.step.model_version", "ensemble_scheduling.step.input_map",
        "ensemble_scheduling.step.output_map",
        # A Python model's (backends/python/streaming.py reads it from the config.pbtxt).
        "model_transaction_policy", "model_transaction_policy.decoupled",
    }
)  # fmt: skip


def parse_pbtxt(text: str, source: Path | str) -> Any:
    """A config.pbtxt (protobuf text format) as a ModelConfig message."""
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigError(f"{source}: not a valid Triton model configuration: {exc}") from None


def parse_json(text: str | bytes, source: str) -> Any:
    """The JSON form of a ModelConfig (GET .../config answers it; a load request may carry it)."""
    try:
        return json_format.Parse(text, pb.ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(f"{source}: not a valid Triton model configuration: {exc}") from None


def load_pbtxt(path: Path, expected_name: str) -> tuple[ModelConfig, tuple[str, ...]]:
    """Read REPO/<model>/config.pbtxt as dlscale's config, and the fields it leaves aside; a
    Python model's `auto_complete_config` completes it first, as in Triton."""
    message = auto_completed(parse_pbtxt(config_text(path), path), path.parent)
    return convert(message, expected_name, path)


def auto_completed(message: Any, folder: Path) -> Any:
    """The message as the model's `auto_complete_config` completes it (backends/python/
    autocomplete.py), or as it is when the model is not Python or defines none."""
    if message.backend != "python":
        return message
    code = newest_file(folder, message.default_model_filename or "model.py")
    if code is None or not defines_method(code, CLASS, METHOD):  # read, not run
        return message
    given = json_format.MessageToDict(message, preserving_proto_field_name=True)
    for tensor in (*given.get("input", ()), *given.get("output", ())):
        tensor["dims"] = [int(d) for d in tensor.get("dims", ())]  # int64s print as strings
    try:
        return json_format.ParseDict(auto_complete(code, given), pb.ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(f"{code}: auto_complete_config made an invalid config: {exc}") from None


def convert(
    message: Any, expected_name: str, source: Path | str
) -> tuple[ModelConfig, tuple[str, ...]]:
    """dlscale's config for a ModelConfig message, and the fields set that it does not act on."""
    if message.name:
        check_name(source, expected_name, message.name)
    data: dict[str, Any] = {"name": expected_name, "max_batch_size": message.max_batch_size}
    if message.platform == "ensemble":
        data["steps"] = [_step(s) for s in message.ensemble_scheduling.step]
    else:
        data["backend"] = _backend(message, source)
        if message.platform:
            data["platform"] = message.platform
    if message.default_model_filename:
        data["model_file"] = message.default_model_filename
    if message.input:
        data["inputs"] = [_tensor(t, "input", source) for t in message.input]
    if message.output:
        data["outputs"] = [_tensor(t, "output", source) for t in message.output]
    if message.HasField("dynamic_batching"):
        data["batching"] = _batching(message.dynamic_batching)
    if message.HasField("response_cache"):
        data["response_cache"] = message.response_cache.enable
    if message.model_warmup:
        data["warmup"] = [_warmup(w) for w in message.model_warmup]
    if message.instance_group:
        data["instances"] = [
            d for g in message.instance_group for d in _instances(g, data.get("backend", ""))
        ]
    if message.HasField("version_policy"):
        data["version_policy"] = _version_policy(message.version_policy)
    parameters = {k: v.string_value for k, v in message.parameters.items()}
    if parameters:
        data["metadata"] = parameters
    if parameters and "steps" not in data:
        data["backend_options"] = {
            ORT_PARAMETERS[k]: _count(source, k, v)
            for k, v in parameters.items()
            if k in ORT_PARAMETERS and v.strip().isdigit()
        }
        if data["backend"] == "python":  # the model reads them all, as in Triton
            data["backend_options"] = {"parameters": parameters}
            if ISOLATION_PARAMETER in parameters:
                data["backend_options"]["isolation"] = parameters[ISOLATION_PARAMETER]
            if PYTHON_MEMORY in parameters:
                bound = parameters[PYTHON_MEMORY].strip()
                data["backend_options"]["max_worker_memory_mb"] = (
                    int(bound) if bound.isdigit() else bound  # the backend refuses a non-number
                )
    if data.get("backend") == "lora" and "base" in parameters:  # a LoRA adapter's base model
        data["base"] = parameters["base"]
    if message.model_transaction_policy.decoupled and data.get("backend") == "python":
        # Read here once: the backend takes it from its options, as a config.toml gives it.
        data.setdefault("backend_options", {})["decoupled"] = True
    return parse_config(data, source), _ignored(message)


def _count(source: Path | str, key: str, value: str) -> int:
    """A parameter's thread count: plain decimal digits, few enough to be a count (a client's
    5,000-digit or superscript "digits" are its mistake, not the server's)."""
    digits = value.strip()
    if not digits.isascii() or len(digits) > MAX_COUNT_DIGITS:
        shown = digits if len(digits) <= 20 else f"{digits[:20]}... ({len(digits)} characters)"
        raise ConfigError(
            f"{source}: parameter {key!r} must be a decimal count of at most "
            f"{MAX_COUNT_DIGITS} ASCII digits, not {shown!r}"
        )
    return int(digits)


def _ignored(message: Any) -> tuple[str, ...]:
    unsupported = {p for p in _set_fields(message) if p not in SUPPORTED}
    # Name the deepest field only: "optimization.cuda.graphs", not also "optimization".
    leaves = {p for p in unsupported if not any(o.startswith(p + ".") for o in unsupported)}
    for group in message.instance_group:
        if group.kind == pb.ModelInstanceGroup.KIND_MODEL:
            leaves.add("instance_group.kind: KIND_MODEL (placed as KIND_CPU)")
        elif group.kind == pb.ModelInstanceGroup.KIND_GPU and not group.gpus:
            leaves.add("instance_group.gpus: none listed (placed on GPU 0 only)")
    return tuple(sorted(leaves))


def _set_fields(message: Message, prefix: str = "") -> Iterator[str]:
    """Paths of every field set in `message`, recursively; maps are named as a whole."""
    for field, value in message.ListFields():
        path = prefix + field.name
        yield path
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        for item in value if field.is_repeated else [value]:
            yield from _set_fields(item, path + ".")


def _backend(message: Any, source: Path | str) -> str:
    for field in ("platform", "backend"):
        value = getattr(message, field)
        if value and value not in BACKENDS:
            runs = sorted({k for k, v in BACKENDS.items() if v != "null"})
            raise ConfigError(
                f"{source}: field '{field}': {value!r} is not a runtime dlscale has (it runs "
                f"{', '.join(runs)}); convert the model to ONNX to serve it here"
            )
    named = message.platform or message.backend
    return BACKENDS[named] if named else "onnxruntime"


def _step(step: Any) -> dict[str, Any]:
    # Triton's -1 (and 0) mean the newest version, as dlscale's 0 does.
    return {
        "model": step.model_name,
        "version": max(step.model_version, 0),
        "input_map": dict(step.input_map),
        "output_map": dict(step.output_map),
    }


def _tensor(tensor: Any, role: str, source: Path | str) -> dict[str, Any]:
    type_name = pb.DataType.Name(tensor.data_type)
    if type_name == "TYPE_INVALID":
        raise ConfigError(f"{source}: field '{role}.{tensor.name}.data_type': missing")
    datatype = "BYTES" if type_name == "TYPE_STRING" else type_name.removeprefix("TYPE_")
    out = {"name": tensor.name, "datatype": datatype, "shape": list(tensor.dims)}
    if role == "output" and tensor.label_filename:
        out["label_file"] = tensor.label_filename
    return out


def _batching(b: Any) -> dict[str, Any]:
    queue = b.default_queue_policy
    return {
        "max_queue_delay_us": b.max_queue_delay_microseconds,
        "preferred_batch_sizes": list(b.preferred_batch_size),
        # Triton's 0 means no priorities: one level.
        "priority_levels": b.priority_levels or 1,
        "default_priority_level": b.default_priority_level,
        "max_queue_size": queue.max_queue_size,
        "default_timeout_us": queue.default_timeout_microseconds,
    }


def _instances(group: Any, backend: str) -> list[dict[str, Any]]:
    # Triton's default count: 2 for ONNX Runtime on CPU, else 1.
    cpu_default = 2 if backend == "onnxruntime" else 1
    gpu = group.kind == pb.ModelInstanceGroup.KIND_GPU or (
        group.kind == pb.ModelInstanceGroup.KIND_AUTO and group.gpus
    )
    if not gpu:
        return [{"count": group.count or cpu_default, "device": "cpu"}]
    count = group.count or 1
    # `count` instances on every GPU listed; with none listed Triton uses every GPU, and this
    # mapping GPU 0 (named in the warning).
    return [{"count": count, "device": f"cuda:{i}"} for i in group.gpus] or [
        {"count": count, "device": "cuda"}
    ]


def _version_policy(policy: Any) -> dict[str, Any]:
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return {"all": True}
    if which == "specific":
        return {"specific": list(policy.specific.versions)}
    return {"latest": policy.latest.num_versions or 1}


def _warmup(message: Any) -> dict[str, Any]:
    """A model_warmup entry as config.toml's [[warmup]]: each input zeros, random or a file."""
    kinds = {}
    for name, spec in message.inputs.items():
        which = spec.WhichOneof("input_data_type")
        kinds[name] = (
            f"file:{spec.input_data_file}" if which == "input_data_file"
            else "random" if which == "random_data" else "zero"
        )  # fmt: skip
    return {
        "name": message.name,
        "batch_size": message.batch_size or 1,
        "count": message.count or 1,
        "inputs": kinds,
    }
