"""The tensors a model file has (ONNX, read without a runtime) and those its config declares."""

from __future__ import annotations

from pathlib import Path

import onnx

from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig
from dlscale.types import Datatype, TensorSpec


def reconcile(
    config: ModelConfig,
    from_model_inputs: list[TensorSpec],
    from_model_outputs: list[TensorSpec],
    source: Path | str,
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The model's served inputs and outputs: the config's where given, checked against the file.

    A config may narrow a variable dimension of the file to a fixed one, never the reverse, and
    a batched model's file must leave its first dimension variable.
    """
    inputs = _one_side(config, "inputs", from_model_inputs, source)
    outputs = _one_side(config, "outputs", from_model_outputs, source)
    return inputs, outputs


def _one_side(
    config: ModelConfig,
    which: str,
    actual: list[TensorSpec],
    source: Path | str,
) -> list[TensorSpec]:
    if config.batched:
        for spec in actual:
            if spec.shape and spec.shape[0] not in (-1, config.max_batch_size):
                raise ConfigError(
                    f"{source}: field 'max_batch_size': {config.max_batch_size} needs a variable "
                    f"batch dimension, but the model file fixes {which[:-1]} {spec.name!r} "
                    f"at shape {list(spec.shape)}"
                )
    declared = config.tensor_specs("inputs" if which == "inputs" else "outputs")
    if declared is None:
        if not config.batched:
            return actual
        return [TensorSpec(s.name, s.datatype, (-1, *s.shape[1:])) for s in actual]
    by_name = {s.name: s for s in actual}
    missing = [d.name for d in declared if d.name not in by_name]
    if missing:
        raise ConfigError(
            f"{source}: field '{which}': {missing} not in the model file, which has "
            f"{sorted(by_name)}"
        )
    if which == "inputs":
        undeclared = sorted(set(by_name) - {d.name for d in declared})
        if undeclared:
            raise ConfigError(
                f"{source}: field 'inputs': the model file also needs {undeclared}; "
                "declare every input or none"
            )
    for want in declared:
        _check_tensor(want, by_name[want.name], which, source)
    return declared


def _check_tensor(want: TensorSpec, got: TensorSpec, which: str, source: Path | str) -> None:
    field = f"{which}.{want.name}"
    if want.datatype != got.datatype:
        raise ConfigError(
            f"{source}: field '{field}.datatype': expected {got.datatype.value} "
            f"(as in the model file), got {want.datatype.value}"
        )
    if not got.matches(want.shape):
        raise ConfigError(
            f"{source}: field '{field}.shape': expected a shape that fits the model file's "
            f"{list(got.shape)} (batch dim included), got {list(want.shape)}"
        )


def onnx_signature(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX file, read from its graph (weights are not loaded)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, onnx.onnx_cpp2py_export.checker.ValidationError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the ONNX graph: {exc}") from None
    weights = {init.name for init in model.graph.initializer}

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        return TensorSpec(value.name, Datatype.from_numpy(dtype), shape)

    inputs = [spec(v) for v in model.graph.input if v.name not in weights]
    return inputs, [spec(v) for v in model.graph.output]
