"""The model repositories the test suites serve, each written with the one builder (models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from tests.toolkit.models import (
    BATCH,
    I64,
    Mlp,
    add_graph,
    combine,
    fails_on_even_batches,
    fragile_graph,
    identity_graph,
    not_graph,
    save_onnx,
    scale_graph,
    sum_and_copy_graph,
    sum_and_diff_graph,
    widen_graph,
    write_broken,
    write_model,
    write_null_model,
)

#: The REST suite's "mlp": two dense layers with a ReLU between them.
REST_MLP = Mlp.seeded(7, (16, 32, 4))
#: The gRPC suite's "mlp": one dense layer, y = x @ MLP_W + MLP_B.
GRPC_MLP = Mlp.seeded(7, (16, 8))
MLP_W, MLP_B = GRPC_MLP.layers[0]
#: The gRPC suite's fragile model fails whenever a batch holds exactly this many rows.
FRAGILE_ROWS = 3
#: How many times the gRPC suite's widen model repeats its input row.
WIDEN = 64
#: The gRPC message limit of the suite's second, small-limit server.
SMALL_LIMIT = 16 * 1024

BATCHED = "max_batch_size = {max_batch}\n[batching]\nmax_queue_delay_us = {delay}\n"
#: A null model's tensors: FP32 [batch, width] in, FP32 [batch, out_width] out (an echo when the
#: widths agree, else zeros).
NULL_TENSORS = (
    '[[inputs]]\nname = "{inp}"\ndatatype = "FP32"\nshape = [{width}]\n'
    '[[outputs]]\nname = "{out}"\ndatatype = "FP32"\nshape = [{out_width}]\n'
)


def mlp_reference(x: np.ndarray) -> np.ndarray:
    """What the REST suite's mlp computes, in numpy."""
    return np.asarray(REST_MLP.reference(x))


def rest_repository(root: Path) -> Path:
    """Every model the REST tests use."""
    write_model(root, "identity", identity_graph(16), BATCHED.format(max_batch=64, delay=500))
    write_model(
        root,
        "mlp",
        REST_MLP.graph(),
        BATCHED.format(max_batch=64, delay=500) + "[[instances]]\ncount = 2\n",
    )
    write_model(root, "two_inputs", sum_and_copy_graph(), "max_batch_size = 8\n")
    strings = identity_graph(2, "text", "echo", TensorProto.STRING)
    write_model(root, "strings", strings, "max_batch_size = 8\n")
    write_model(
        root, "int64", scale_graph(2, [BATCH, 3], "n", "doubled", I64), "max_batch_size = 8\n"
    )
    # Not batched: shapes are exact, no batch dimension.
    fixed = combine("fixed", scale_graph(3.0, [2, 3]), not_graph("flags", "flipped", [3]))
    write_model(root, "fixed", fixed, "max_batch_size = 0\n")
    write_model(
        root, "half", identity_graph(4, "x", "y", TensorProto.FLOAT16), "max_batch_size = 8\n"
    )
    for version, addend in ((1, 1.0), (2, 2.0)):
        plus = "max_batch_size = 8\n[version_policy]\nall = true\n"
        write_model(root, "plus", add_graph(addend), plus, version)
    # A long batching delay: a request waits there, so its timeout can expire. It only echoes,
    # so the null backend serves it.
    write_null_model(
        root,
        "queued",
        BATCHED.format(max_batch=8, delay=300_000)
        + "priority_levels = 2\nadaptive_queue_delay = false\n"
        + NULL_TENSORS.format(inp="input", out="output", width=4, out_width=4),
    )
    # An odd max_batch_size: warm-up (batches 1 and 7) passes, even batches fail. It waits up to
    # a second to fill a batch, so that requests sent together share one.
    write_model(
        root,
        "fails_even",
        fails_on_even_batches(),
        BATCHED.format(max_batch=7, delay=1_000_000) + "adaptive_queue_delay = false\n",
    )
    write_broken(root)
    return root


def grpc_repository(root: Path) -> Path:
    """Every model the gRPC tests use."""
    identity = identity_graph(16, "x", "y")
    write_model(
        root,
        "identity",
        identity,
        BATCHED.format(max_batch=32, delay=500) + "priority_levels = 2\n",
    )
    write_model(root, "mlp", GRPC_MLP.graph(), BATCHED.format(max_batch=32, delay=500))
    # Loaded and unloaded by the tests; it only echoes, so the null backend serves it.
    write_null_model(
        root,
        "spare",
        BATCHED.format(max_batch=8, delay=0)
        + NULL_TENSORS.format(inp="x", out="y", width=16, out_width=16),
    )
    write_model(root, "two_inputs", sum_and_diff_graph(), BATCHED.format(max_batch=8, delay=0))
    ints_bytes = combine(
        "ints_bytes",
        scale_graph(2, [BATCH, 3], "i", "i2", I64),
        identity_graph(2, "s", "s_out", TensorProto.STRING),
    )
    write_model(root, "ints_bytes", ints_bytes, BATCHED.format(max_batch=8, delay=0))
    # BF16 is left out: ONNX Runtime's Python API takes no bfloat16 numpy arrays (the codec's
    # unit tests cover BF16 on the wire).
    half = identity_graph(2, "h", "h_out", TensorProto.FLOAT16)
    write_model(root, "half", half, BATCHED.format(max_batch=8, delay=0))
    write_model(root, "widen", widen_graph(WIDEN), BATCHED.format(max_batch=32, delay=0))
    write_model(root, "unbatched", scale_graph(2.0, [2, 3]), 'platform = "onnxruntime_onnx"\n')
    # A long, strict wait: requests sent together, or one at a time, share one batch.
    write_model(
        root,
        "fragile",
        fragile_graph(FRAGILE_ROWS),
        BATCHED.format(max_batch=4, delay=1_000_000) + "adaptive_queue_delay = false\n",
    )
    return root


def grpc_limit_repository(root: Path) -> Path:
    """identity ([batch, 16] echoed) and widen ([batch, 4] in, zeros of [batch, 4 * WIDEN] out),
    as the small-limit server serves them: null models, since only sizes matter there."""
    write_null_model(
        root,
        "identity",
        BATCHED.format(max_batch=32, delay=0)
        + NULL_TENSORS.format(inp="x", out="y", width=16, out_width=16),
    )
    write_null_model(
        root,
        "widen",
        BATCHED.format(max_batch=32, delay=0)
        + NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4 * WIDEN),
    )
    return root


def bench_repository(root: Path) -> Path:
    """identity (FP32 [batch, 4], INPUT0 -> OUTPUT0) and broken (the same plus one, for the
    accuracy tests)."""
    config = "max_batch_size = 64\n[batching]\nmax_queue_delay_us = 200\n"
    write_model(root, "identity", identity_graph(4, "INPUT0", "OUTPUT0"), config)
    write_model(root, "broken", add_graph(1.0, 4, "INPUT0", "OUTPUT0"), config)
    return root


def serving_repository(root: Path) -> Path:
    """identity [batch, 16], plus (versions 1 and 2 add 1 and 2) and a broken config."""
    write_model(root, "identity", identity_graph(16), "max_batch_size = 32\n")
    plus = "max_batch_size = 8\n[version_policy]\nall = true\n"
    write_model(root, "plus", add_graph(1.0), plus)
    write_model(root, "plus", add_graph(2.0), plus, version=2)
    write_broken(root)
    return root


#: The Triton-style suite's classifier: one dense layer, 16 features to 10 class scores.
CLASSIFIER = Mlp.seeded(3, (16, 10))
CLASSES = tuple(f"class-{chr(ord('a') + i)}" for i in range(10))

#: Triton's "simple" example as its docs write it, for ONNX Runtime.
SIMPLE_PBTXT = """name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
"""

#: A classifier configured as Triton's densenet_onnx example is: a label file beside it,
#: dynamic batching, a CPU instance group; and a warm-up dlscale does not act on.
CLASSIFIER_PBTXT = """platform: "onnxruntime_onnx"
max_batch_size: 16
version_policy: { latest: { num_versions: 1 } }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 10 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32
  dims: [ 16 ] zero_data: true } } } ]
"""


def simple_graph() -> onnx.GraphProto:
    """Triton's "simple": OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, FP32 [batch, 4]."""
    graph = sum_and_diff_graph()
    renames = {"a": "INPUT0", "b": "INPUT1", "sum": "OUTPUT0", "diff": "OUTPUT1"}
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for value_info in (*graph.input, *graph.output):
        value_info.name = renames[value_info.name]
    return graph


def triton_repository(root: Path) -> Path:
    """Models configured as Triton and MLServer users have them: config.pbtxt (simple,
    classifier), none at all (bare: auto-complete) and model-settings.json (settings)."""
    for name, graph, pbtxt in (
        ("simple", simple_graph(), SIMPLE_PBTXT),
        ("classifier", CLASSIFIER.graph(), CLASSIFIER_PBTXT),
    ):
        save_onnx(graph, root / name / "1" / "model.onnx")
        (root / name / "config.pbtxt").write_text(pbtxt)
    (root / "classifier" / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    save_onnx(identity_graph(4, "INPUT0", "OUTPUT0"), root / "bare" / "1" / "model.onnx")
    save_onnx(identity_graph(4, "x", "y"), root / "settings" / "model.onnx")
    settings = {
        "name": "settings",
        "implementation": "mlserver_runtime.OnnxModel",
        "parameters": {"uri": "./model.onnx"},
        "max_batch_size": 8,
        "max_batch_time": 0.0002,
    }
    (root / "settings" / "model-settings.json").write_text(json.dumps(settings))
    return root


def shm_repository(root: Path) -> Path:
    """The shared-memory suites' models: identity (FP32 [batch, 16], x -> y), sum_and_diff (a, b
    -> sum, diff, FP32 [batch, 4]), strings (BYTES [batch, 2]) and a null echo whose requests
    wait in its queue until 8 rows are there (FP32 [batch, 16], input -> output)."""
    write_model(
        root, "identity", identity_graph(16, "x", "y"), BATCHED.format(max_batch=64, delay=500)
    )
    write_model(root, "sum_and_diff", sum_and_diff_graph(), BATCHED.format(max_batch=8, delay=0))
    strings = identity_graph(2, "text", "echo", TensorProto.STRING)
    write_model(root, "strings", strings, "max_batch_size = 8\n")
    # A request waits here until the batch holds 8 rows (or for 60 s): the tests fill it.
    write_null_model(
        root,
        "queued",
        BATCHED.format(max_batch=8, delay=60_000_000)
        + "adaptive_queue_delay = false\n"
        + NULL_TENSORS.format(inp="input", out="output", width=16, out_width=16),
    )
    return root


#: The tenants' service times (null backend sleeps): the protected model 10 ms a request; the
#: neighbor 2 ms a batch and 6 ms a row, so that its full batch of 64 takes 386 ms.
PROTECTED_US, NEIGHBOR_US, NEIGHBOR_ROW_US, NEIGHBOR_BATCH = 10_000, 2000, 6000, 64
#: The protected model's p99 objective: 8 of its service times; a full neighbor batch is 39.
OBJECTIVE_US = 80_000


def tenants_repository(
    root: Path, rate_limit: float = 0.0, objective_us: int = OBJECTIVE_US
) -> Path:
    """Two null models sharing the CPU under [qos]: `protected` (objective `objective_us`, one
    request a batch; 0: best effort too) and `neighbor` (best effort, batches of up to 64);
    `rate_limit` (req/s, burst 2) on the neighbor when given."""
    tensors = NULL_TENSORS.format(inp="x", out="y", width=4, out_width=4)
    write_null_model(
        root,
        "protected",
        "max_batch_size = 1\n"
        + tensors
        + f"[backend_options]\ndelay_us = {PROTECTED_US}\n"
        + f"[qos]\nlatency_objective_us = {objective_us}\n",
    )
    limit = f"rate_limit = {rate_limit}\nrate_burst = 2\n" if rate_limit else ""
    write_null_model(
        root,
        "neighbor",
        BATCHED.format(max_batch=NEIGHBOR_BATCH, delay=0)
        + tensors
        + f"[backend_options]\ndelay_us = {NEIGHBOR_US}\ndelay_us_per_row = {NEIGHBOR_ROW_US}\n"
        + f"[qos]\nweight = 1.0\n{limit}",
    )
    return root
