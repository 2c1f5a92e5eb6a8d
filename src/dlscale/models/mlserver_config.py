"""MLServer's model-settings.json as dlscale's config, for ONNX (and PyTorch) model files."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig, check_name, config_text, parse_config

#: The model file's suffix, and the backend that runs it.
SUFFIXES = {".onnx": "onnxruntime", ".pt": "torch", ".pt2": "torch"}
#: Keys of `parameters.extra` that are dlscale backend options.
EXTRA_OPTIONS = ("intra_op_threads", "inter_op_threads")
#: Top-level fields acted on; the others are named in the warning.
_TOP = {"name", "platform", "max_batch_size", "max_batch_time", "inputs", "outputs", "parameters"}


def load_settings(path: Path, expected_name: str) -> tuple[ModelConfig, tuple[str, ...]]:
    """Read REPO/<model>/model-settings.json, and the fields it sets that dlscale ignores."""
    try:
        doc = json.loads(config_text(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object of model settings")
    check_name(path, expected_name, doc.get("name", expected_name))
    params = _object(doc.get("parameters"), "parameters", path)
    extra = _object(params.get("extra"), "parameters.extra", path)
    model_file = _model_file(params.get("uri"), path)
    max_batch = doc.get("max_batch_size", 0)
    delay_s = doc.get("max_batch_time", 0)
    # MLServer batches adaptively only with both knobs above their off values.
    batched = isinstance(max_batch, int) and max_batch > 1 and _number(delay_s) > 0
    data: dict[str, Any] = {
        "name": expected_name,
        "backend": SUFFIXES[PurePosixPath(model_file).suffix] if model_file else "onnxruntime",
        "max_batch_size": max_batch if batched else 0,
        "backend_options": {k: extra[k] for k in EXTRA_OPTIONS if k in extra},
    }
    if model_file:
        data["model_file"] = model_file
    if batched:
        data["batching"] = {"max_queue_delay_us": round(_number(delay_s) * 1e6)}
    if doc.get("platform"):
        data["platform"] = doc["platform"]
    for side in ("inputs", "outputs"):
        if doc.get(side):
            data[side] = [_tensor(t, batched, f"{side}", path) for t in doc[side]]
    ignored = sorted(
        [k for k in doc if k not in _TOP]
        + [f"parameters.{k}" for k in params if k not in ("uri", "extra")]
        + [f"parameters.extra.{k}" for k in extra if k not in EXTRA_OPTIONS]
    )
    if not batched and (max_batch or delay_s):
        ignored.append("max_batch_size/max_batch_time (adaptive batching needs both above 1 and 0)")
    return parse_config(data, path), tuple(ignored)


def _object(value: Any, field: str, path: Path) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: field '{field}': expected an object, got {value!r}")
    return value


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _model_file(uri: Any, path: Path) -> str:
    """The model file relative to the model folder (config.toml's model_file checks that it
    stays inside)."""
    if uri is None:
        return ""
    relative = PurePosixPath(str(uri))
    if relative.suffix not in SUFFIXES:
        raise ConfigError(
            f"{path}: field 'parameters.uri': {uri!r} is not a model file dlscale runs "
            f"(expected one of {sorted(SUFFIXES)})"
        )
    return str(relative)


def _tensor(tensor: Any, batched: bool, side: str, path: Path) -> dict[str, Any]:
    if not isinstance(tensor, dict):
        raise ConfigError(f"{path}: field '{side}': expected objects, got {tensor!r}")
    shape = list(tensor.get("shape", []))
    # MLServer's shapes include the batch dimension; config.toml's leave it out when batching.
    return {
        "name": tensor.get("name", ""),
        "datatype": tensor.get("datatype", ""),
        "shape": shape[1:] if batched and shape else shape,
    }
