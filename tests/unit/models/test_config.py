"""config.toml: good configs parse; each broken one gets a message naming file, field and want."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig, load_config, write_config
from dlscale.models.signature import reconcile
from dlscale.types import Datatype, TensorSpec

GOOD = """
name = "mlp"
backend = "onnxruntime"
max_batch_size = 64
[[inputs]]
name = "input"
datatype = "FP32"
shape = [256]
[batching]
max_queue_delay_us = 500
preferred_batch_sizes = [16, 32]
priority_levels = 2
max_queue_size = 100
default_timeout_us = 10000
[[instances]]
count = 2
device = "cpu"
[version_policy]
latest = 2
[backend_options]
intra_op_threads = 1
graph_optimization_level = "extended"
custom_knob = "kept"
[metadata]
task = "classification"
"""


def _write(tmp_path: Path, text: str, name: str = "mlp") -> Path:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    path = folder / "config.toml"
    path.write_text(text)
    return path


def test_a_good_config_parses_every_field(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD), expected_name="mlp")
    assert config.max_batch_size == 64 and config.batched
    assert config.tensor_specs("inputs") == [TensorSpec("input", Datatype.FP32, (-1, 256))]
    assert config.tensor_specs("outputs") is None
    assert config.batching.preferred_batch_sizes == [16, 32]
    assert config.instances[0].count == 2
    assert config.version_policy.select([1, 2, 3]) == [2, 3]
    assert config.backend_options.intra_op_threads == 1
    assert config.backend_options.model_extra == {"custom_knob": "kept"}
    assert config.metadata["task"] == "classification"


def test_name_defaults_to_the_folder_and_write_round_trips(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "max_batch_size = 8\n", "tiny"), expected_name="tiny")
    assert config.name == "tiny" and config.instances[0].device == "cpu"
    out = tmp_path / "copy.toml"
    write_config(config, out)
    assert load_config(out) == config


BROKEN = [
    ("max_batch_size = -1", "field 'max_batch_size': Input should be greater than or equal to 0"),
    ('max_batch_size = "eight"', "field 'max_batch_size': Input should be a valid integer"),
    ('backend = "openvino"', "field 'backend': Value error, unknown backend 'openvino'"),
    ("max_bach_size = 8", "field 'max_bach_size': Extra inputs are not permitted"),
    ("[batching]\nmax_queue_delay_us = -5", "field 'batching.max_queue_delay_us'"),
    ("[batching]\npriority_levels = 0", "field 'batching.priority_levels'"),
    ("[qos]\nttft_objective_us = -1", "field 'qos.ttft_objective_us': Input should be greater"),
    ('[qos]\ntpot_objective_us = "50ms"', "field 'qos.tpot_objective_us': Input should be a valid"),
    ("[qos]\nttft_objective = 5", "field 'qos.ttft_objective': Extra inputs are not permitted"),
    (
        "max_batch_size = 8\n[batching]\npreferred_batch_sizes = [4, 16]",
        "preferred_batch_sizes [16] exceed max_batch_size 8",
    ),
    (
        "[batching]\npriority_levels = 2\ndefault_priority_level = 3",
        "default_priority_level 3 is above priority_levels 2",
    ),
    ('[[instances]]\ncount = 1\ndevice = "tpu:0"', "field 'instances.0.device'"),
    ("[[instances]]\ncount = 0", "field 'instances.0.count'"),
    ('[[inputs]]\nname = "x"\ndatatype = "FP128"\nshape = [1]', "field 'inputs.0.datatype'"),
    ('[[inputs]]\nname = "x"\ndatatype = "FP32"', "field 'inputs.0.shape': Field required"),
    ("[version_policy]\nlatest = 1\nall = true", "give only one of latest, all or specific"),
    ('[backend_options]\ngraph_optimization_level = "max"', "graph_optimization_level"),
    ('name = "other"', "field 'name': expected the folder's name 'mlp', got 'other'"),
    ("max_batch_size = = 3", "not valid TOML"),
    (
        '[[inputs]]\nname = "x"\ndatatype = "FP32"\nshape = [1]\n' * 2,
        "inputs: ['x'] named more than once",
    ),
    (
        '[[outputs]]\nname = "y"\ndatatype = "FP32"\nshape = [1]\n' * 2,
        "outputs: ['y'] named more than once",
    ),
]


@pytest.mark.parametrize(("text", "message"), BROKEN, ids=[m[:40] for _, m in BROKEN])
def test_broken_configs_name_file_field_and_expectation(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, expected_name="mlp")
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_a_missing_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing"):
        load_config(tmp_path / "nope" / "config.toml")


FILE_IN = [TensorSpec("input", Datatype.FP32, (-1, 256))]
FILE_OUT = [TensorSpec("output", Datatype.FP32, (-1, 10))]


def _config(**fields: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "mlp", **fields})


def test_signature_from_the_file_when_omitted() -> None:
    inputs, outputs = reconcile(_config(max_batch_size=8), FILE_IN, FILE_OUT, "cfg")
    assert inputs == FILE_IN and outputs == FILE_OUT


SIGNATURE_MISMATCH = [
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [256]}]}, "['x'] not in the model"),
    ({"inputs": [{"name": "input", "datatype": "INT64", "shape": [256]}]}, "expected FP32"),
    ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [255]}]}, "fits the model file's"),
    ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 256]}]}, "fits the model"),
]


@pytest.mark.parametrize(("fields", "message"), SIGNATURE_MISMATCH)
def test_declared_tensors_are_checked_against_the_file(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        reconcile(_config(max_batch_size=8, **fields), FILE_IN, FILE_OUT, "cfg")


def test_a_fixed_batch_dimension_cannot_be_batched() -> None:
    fixed = [TensorSpec("input", Datatype.FP32, (1, 256))]
    with pytest.raises(ConfigError, match="needs a variable batch dimension"):
        reconcile(_config(max_batch_size=8), fixed, FILE_OUT, "cfg")


def test_platform_defaults_to_tritons_name_for_the_backend() -> None:
    assert ModelConfig(name="m").platform_name == "onnxruntime_onnx"
    assert ModelConfig(name="m", backend="torch").platform_name == "pytorch_libtorch"
    assert ModelConfig(name="m", platform="custom").platform_name == "custom"
