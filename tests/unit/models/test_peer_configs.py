"""Triton's config.pbtxt (and its JSON form) and MLServer's model-settings.json as dlscale configs:
what maps, what is named as not acted on, and errors that say what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from dlscale.errors import ConfigError
from dlscale.models.config import ModelConfig, parse_config
from dlscale.models.mlserver_config import load_settings
from dlscale.models.triton_config import convert, parse_json, parse_pbtxt
from dlscale.types import Datatype, TensorSpec

# As Triton's model_configuration.md writes one, for an ONNX model.
DOCS_STYLE = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific: { versions: [ 1, 3 ] } }
input [
  {
    name: "input0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "input1"
    data_type: TYPE_STRING
    dims: [ -1 ]
  }
]
output [
  {
    name: "output0"
    data_type: TYPE_FP32
    dims: [ 16 ]
    label_filename: "labels.txt"
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy {
    max_queue_size: 50
    default_timeout_microseconds: 20000
    allow_timeout_override: true
  }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "owner" value: { string_value: "vision" } }
"""


def _convert(text: str, name: str = "simple") -> tuple[ModelConfig, tuple[str, ...]]:
    return convert(parse_pbtxt(text, "config.pbtxt"), name, "config.pbtxt")


def test_a_docs_style_config_maps_field_for_field() -> None:
    config, ignored = convert(parse_pbtxt(DOCS_STYLE, "cfg"), "simple", "cfg")
    assert ignored == ()
    assert (config.backend, config.platform_name, config.max_batch_size) == (
        "onnxruntime",
        "onnxruntime_onnx",
        8,
    )
    assert config.tensor_specs("inputs") == [
        TensorSpec("input0", Datatype.FP32, (-1, 16)),
        TensorSpec("input1", Datatype.BYTES, (-1, -1)),
    ]
    assert config.outputs is not None and config.outputs[0].label_file == "labels.txt"
    b = config.batching
    assert (b.preferred_batch_sizes, b.max_queue_delay_us) == ([4, 8], 100)
    assert (b.priority_levels, b.default_priority_level) == (2, 2)
    assert (b.max_queue_size, b.default_timeout_us) == (50, 20000)
    assert [(i.count, i.device) for i in config.instances] == [(2, "cpu")]
    assert config.version_policy.specific == [1, 3]
    assert config.backend_options.intra_op_threads == 1
    assert config.metadata == {"intra_op_thread_count": "1", "owner": "vision"}


UNSUPPORTED = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 8 ] reshape: { shape: [ 24 ] } } ]
dynamic_batching {
  max_queue_delay_microseconds: 100
  default_queue_policy { timeout_action: DELAY }
  priority_queue_policy { key: 1 value: { max_queue_size: 3 } }
}
optimization { cuda { graphs: true } execution_accelerators {
  gpu_execution_accelerator : [ { name : "tensorrt" } ] } }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32
  dims: [ 3, 8 ] zero_data: true } } } ]
response_cache { enable: true }
instance_group [ { count: 1 kind: KIND_MODEL } ]
"""


def test_fields_not_acted_on_are_each_named_once() -> None:
    _, ignored = _convert(UNSUPPORTED)
    assert ignored == (
        "dynamic_batching.default_queue_policy.timeout_action",
        "dynamic_batching.priority_queue_policy",
        "input.reshape.shape",
        "instance_group.kind: KIND_MODEL (placed as KIND_CPU)",
        "optimization.cuda.graphs",
        "optimization.execution_accelerators.gpu_execution_accelerator.name",
    )


def test_model_warmup_becomes_warmup_entries() -> None:
    config, _ = _convert(UNSUPPORTED)
    assert config.warmup is not None and len(config.warmup) == 1
    (entry,) = config.warmup
    assert (entry.name, entry.batch_size, entry.count, entry.inputs) == ("w", 1, 1, {"x": "zero"})
    text = """
    max_batch_size: 8
    model_warmup [ { name: "r" batch_size: 8 count: 3 inputs [
      { key: "a" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } },
      { key: "b" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "b.raw" } } ] } ]
    """
    (entry,) = _convert(text)[0].warmup or []
    assert (entry.batch_size, entry.count) == (8, 3)
    assert entry.inputs == {"a": "random", "b": "file:b.raw"}


def test_instance_groups_become_devices() -> None:
    text = """
    instance_group [
      { count: 1 kind: KIND_GPU gpus: [ 0 ] },
      { count: 2 kind: KIND_GPU gpus: [ 1, 2 ] },
      { kind: KIND_CPU },
      { count: 3 }
    ]
    """
    config, ignored = _convert(text)
    assert [(i.count, i.device) for i in config.instances] == [
        (1, "cuda:0"), (2, "cuda:1"), (2, "cuda:2"), (2, "cpu"), (3, "cpu"),
    ]  # fmt: skip
    assert ignored == ()
    config, ignored = _convert("instance_group [ { count: 2 kind: KIND_GPU } ]")
    assert [(i.count, i.device) for i in config.instances] == [(2, "cuda")]
    assert ignored == ("instance_group.gpus: none listed (placed on GPU 0 only)",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('platform: "tensorrt_plan"', "field 'platform': 'tensorrt_plan' is not a runtime"),
        ('backend: "openvino"', "field 'backend': 'openvino' is not a runtime dlscale has"),
        ('name: "other"', "expected the folder's name 'simple', got 'other'"),
        ('input [ { name: "x" dims: [ 1 ] } ]', "field 'input.x.data_type': missing"),
        ("max_batch_size: 8\ninput [ { name: x } ]", "config.pbtxt: not a valid Triton model"),
        ("max_batch_size: -2", "field 'max_batch_size'"),
        ("versoin_policy: { all {} }", 'has no field named "versoin_policy"'),
    ],
)
def test_bad_configs_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"config\.pbtxt") as info:
        _convert(text)
    assert message in str(info.value)


def test_the_json_form_parses_to_the_same_config() -> None:
    message = parse_pbtxt(DOCS_STYLE, "cfg")
    as_json = json_format.MessageToJson(message, preserving_proto_field_name=True)
    assert parse_json(as_json, "load request") == message
    with pytest.raises(ConfigError, match="load request: not a valid Triton model configuration"):
        parse_json('{"inputs": []}', "load request")


def test_tritons_names_in_config_toml_get_a_hint() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"name": "m", "batching": {"max_queue_delay_microseconds": 5}}, "c.toml")
    assert "did you mean max_queue_delay_us? 'max_queue_delay_microseconds' is Triton's" in str(
        info.value
    )
    with pytest.raises(ConfigError, match=r"did you mean \[\[instances\]\]"):
        parse_config({"name": "m", "instance_group": [{"count": 1}]}, "c.toml")
    with pytest.raises(ConfigError, match="did you mean max_batch_size"):
        parse_config({"name": "m", "max_bach_size": 8}, "c.toml")


# As benchmarks/harness/peers.py writes one for MLServer (a custom ONNX runtime, its own file).
def _settings(tmp_path: Path, **changes: object) -> Path:
    doc = {
        "name": "ident",
        "implementation": "mlserver_runtime.OnnxModel",
        "parameters": {"uri": "./model.onnx", "extra": {"intra_op_threads": 1, "arena": False}},
        "max_batch_size": 16,
        "max_batch_time": 0.0005,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        **changes,
    }
    path = tmp_path / "model-settings.json"
    path.write_text(json.dumps(doc))
    return path


def test_mlserver_settings_map_to_dlscale(tmp_path: Path) -> None:
    config, ignored = load_settings(_settings(tmp_path), "ident")
    assert (config.backend, config.model_file, config.max_batch_size) == (
        "onnxruntime",
        "model.onnx",
        16,
    )
    assert config.batching.max_queue_delay_us == 500
    assert config.tensor_specs("inputs") == [TensorSpec("x", Datatype.FP32, (-1, 4))]
    assert config.backend_options.intra_op_threads == 1
    assert ignored == ("implementation", "parameters.extra.arena")


def test_mlserver_without_adaptive_batching_keeps_exact_shapes(tmp_path: Path) -> None:
    config, ignored = load_settings(_settings(tmp_path, max_batch_time=0), "ident")
    assert config.max_batch_size == 0
    assert config.tensor_specs("inputs") == [TensorSpec("x", Datatype.FP32, (-1, 4))]
    assert "max_batch_size/max_batch_time (adaptive batching needs both above 1 and 0)" in ignored


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "other"}, "field 'name': expected the folder's name 'ident'"),
        ({"parameters": {"uri": "../x.onnx"}}, "must be a path inside the model's folder"),
        ({"parameters": {"uri": "model.joblib"}}, "is not a model file dlscale runs"),
        ({"parameters": "x"}, "field 'parameters': expected an object"),
    ],
)
def test_bad_mlserver_settings(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"model-settings\.json") as info:
        load_settings(_settings(tmp_path, **changes), "ident")
    assert message in str(info.value)
