"""Pipelines (Triton's ensembles) for the tests: small ONNX step models and pipelines over them,
written as Triton users write them (config.pbtxt) and in config.toml."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tests.toolkit.models import (
    BATCH,
    add_graph,
    fails_on_even_batches,
    identity_graph,
    save_onnx,
    scale_graph,
    sum_and_diff_graph,
    write_model,
    write_null_model,
)

#: Step models batch up to this many rows, and so may the pipelines over them.
STEP_BATCH = 8
#: The service time of the "slow" step (null backend), in microseconds: long enough that a
#: request queued behind one of its batches waits for it, whatever the machine.
SLOW_US = 400_000

_STEP = "max_batch_size = {mbs}\n[batching]\nmax_queue_delay_us = 1000\n"
_TRITON_STEP = """max_batch_size: {mbs}
input [ {{ name: "{inp}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "{out}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
"""

#: add_one, then copy (an identity), as Triton's docs write an ensemble. RAW takes any width, so
#: a row of the wrong width passes the pipeline and is refused by its first step.
CHAIN_PBTXT = """name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "add_one"
      model_version: -1
      input_map { key: "INPUT0" value: "RAW" }
      output_map { key: "OUTPUT0" value: "plus_one" }
    },
    {
      model_name: "copy"
      model_version: -1
      input_map { key: "INPUT0" value: "plus_one" }
      output_map { key: "OUTPUT0" value: "RESULT" }
    }
  ]
}
"""

_TENSORS = """[[inputs]]
name = "{inp}"
datatype = "FP32"
shape = [4]
"""
_OUTPUT = """[[outputs]]
name = "{out}"
datatype = "FP32"
shape = [4]
"""
_STEP_TOML = """[[steps]]
model = "{model}"
input_map = {{ {inputs} }}
output_map = {{ {outputs} }}
"""


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    """One [[steps]] table of config.toml."""
    return _STEP_TOML.format(
        model=model,
        inputs=", ".join(f'{k} = "{v}"' for k, v in inputs.items()),
        outputs=", ".join(f'{k} = "{v}"' for k, v in outputs.items()),
    )


def pipeline_toml(
    max_batch: int, inputs: list[str], outputs: list[str], steps: list[str], extra: str = ""
) -> str:
    """A pipeline's config.toml: FP32 [4] tensors and its [[steps]] tables."""
    head = f"max_batch_size = {max_batch}\n{extra}"
    tensors = "".join(_TENSORS.format(inp=n) for n in inputs)
    return head + tensors + "".join(_OUTPUT.format(out=n) for n in outputs) + "".join(steps)


def write_pipeline(root: Path, name: str, config: str, file: str = "config.toml") -> Path:
    """REPO/<name>/<config file> and an empty version folder, as Triton wants for an ensemble."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / file).write_text(config)
    return root / name


def diamond(x: np.ndarray) -> dict[str, np.ndarray]:
    """What the diamond pipeline computes: a = x + 1; SUM = 2a + a; DIFF = 2a - a."""
    a = x + 1
    return {"SUM": 3 * a, "DIFF": a}


def pipeline_repository(root: Path) -> Path:
    """The step models and the pipelines over them.

    - add_one, copy (config.pbtxt), double, join (sum and difference of two inputs), evens
      (fails on batches of an even number of rows), slow (null backend, SLOW_US per batch, one
      row per batch, two priority levels);
    - chain (config.pbtxt): add_one -> copy;
    - diamond: add_one -> {double, copy} -> join, the two branches in parallel;
    - breaks: add_one -> evens; urgent: add_one -> slow (max_batch_size 1).
    """
    save_onnx(add_graph(1.0, 4, "INPUT0", "OUTPUT0"), root / "add_one" / "1" / "model.onnx")
    (root / "add_one" / "config.pbtxt").write_text(
        _TRITON_STEP.format(mbs=STEP_BATCH, inp="INPUT0", out="OUTPUT0")
    )
    save_onnx(identity_graph(4, "INPUT0", "OUTPUT0"), root / "copy" / "1" / "model.onnx")
    (root / "copy" / "config.pbtxt").write_text(
        _TRITON_STEP.format(mbs=STEP_BATCH, inp="INPUT0", out="OUTPUT0")
    )
    write_model(root, "double", scale_graph(2.0, [BATCH, 4]), _STEP.format(mbs=STEP_BATCH))
    write_model(root, "join", sum_and_diff_graph(), _STEP.format(mbs=STEP_BATCH))
    # An odd max_batch_size: its warm-up (1 and 7 rows) passes; 2 rows fail in onnxruntime.
    write_model(root, "evens", fails_on_even_batches(), "max_batch_size = 7\n")
    slow = (
        "max_batch_size = 1\n[batching]\npriority_levels = 2\n"
        f"[backend_options]\ndelay_us = {SLOW_US}\n"
        + _TENSORS.format(inp="INPUT0")
        + _OUTPUT.format(out="OUTPUT0")
    )
    write_null_model(root, "slow", slow)
    write_pipeline(root, "chain", CHAIN_PBTXT, "config.pbtxt")
    write_pipeline(root, "diamond", _diamond())
    write_pipeline(
        root,
        "breaks",
        pipeline_toml(
            7,
            ["x"],
            ["y"],
            [
                step("add_one", {"INPUT0": "x"}, {"OUTPUT0": "a"}),
                step("evens", {"x": "a"}, {"y": "y"}),
            ],
        ),
    )
    write_pipeline(
        root,
        "urgent",
        pipeline_toml(
            1,
            ["x"],
            ["y"],
            [
                step("add_one", {"INPUT0": "x"}, {"OUTPUT0": "a"}),
                step("slow", {"INPUT0": "a"}, {"OUTPUT0": "y"}),
            ],
        ),
    )
    return root


def _diamond() -> str:
    return pipeline_toml(
        STEP_BATCH,
        ["RAW"],
        ["SUM", "DIFF"],
        [
            step("add_one", {"INPUT0": "RAW"}, {"OUTPUT0": "a"}),
            step("double", {"x": "a"}, {"y": "twice"}),
            step("copy", {"INPUT0": "a"}, {"OUTPUT0": "once"}),
            step("join", {"a": "twice", "b": "once"}, {"sum": "SUM", "diff": "DIFF"}),
        ],
    )
