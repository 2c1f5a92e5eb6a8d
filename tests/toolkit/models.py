"""The one builder of the tests' small models: ONNX graphs written with onnx.helper, and
null-backend models that compute nothing (src/dlscale/backends/null.py)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
I64 = TensorProto.INT64
#: The symbolic batch dimension of every batched graph here.
BATCH = "batch"


def value(name: str, elem: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    """A graph input or output."""
    return helper.make_tensor_value_info(name, elem, list(shape))


def onnx_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """The graph as a checked model: opset 17, IR version 9 (what onnxruntime here reads)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def save_onnx(graph: onnx.GraphProto, path: Path) -> Path:
    """Write the graph as a model file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model(graph), path)
    return path


def write_model(
    root: Path, name: str, graph: onnx.GraphProto, config: str, version: int = 1
) -> Path:
    """REPO/<name>/<version>/model.onnx and REPO/<name>/config.toml; returns the model file."""
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.toml").write_text(config)
    return save_onnx(graph, root / name / str(version) / "model.onnx")


def write_null_model(root: Path, name: str, config: str, versions: Sequence[int] = (1,)) -> Path:
    """A null-backend model: `backend = "null"` is prepended to `config`, which declares the
    tensors; each version folder holds the empty marker file. Returns the model's folder."""
    folder = root / name
    for version in versions:
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
        (folder / str(version) / "model.null").touch()
    (folder / "config.toml").write_text('backend = "null"\n' + config)
    return folder


def write_broken(root: Path, name: str = "broken") -> None:
    """A model folder whose config is invalid, so it never loads."""
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.toml").write_text("max_batch_size = -3\n")


def combine(name: str, *graphs: onnx.GraphProto) -> onnx.GraphProto:
    """One graph running the given graphs side by side (their names must not collide)."""
    return helper.make_graph(
        [n for g in graphs for n in g.node],
        name,
        [i for g in graphs for i in g.input],
        [o for g in graphs for o in g.output],
        [t for g in graphs for t in g.initializer],
    )


# -- graphs ---------------------------------------------------------------------------------------


def identity_graph(
    width: int = 16, inp: str = "input", out: str = "output", elem: int = F
) -> onnx.GraphProto:
    """out = inp, [batch, width]."""
    return helper.make_graph(
        [helper.make_node("Identity", [inp], [out])],
        "identity",
        [value(inp, elem, [BATCH, width])],
        [value(out, elem, [BATCH, width])],
    )


def add_graph(
    addend: float, width: int = 4, inp: str = "input", out: str = "output"
) -> onnx.GraphProto:
    """out = inp + addend, FP32 [batch, width]."""
    return helper.make_graph(
        [helper.make_node("Add", [inp, f"{out}_addend"], [out])],
        "add",
        [value(inp, F, [BATCH, width])],
        [value(out, F, [BATCH, width])],
        [helper.make_tensor(f"{out}_addend", F, [1], [addend])],
    )


def scale_graph(
    factor: float, shape: Sequence[int | str], inp: str = "x", out: str = "y", elem: int = F
) -> onnx.GraphProto:
    """out = inp * factor, in the given shape and element type."""
    return helper.make_graph(
        [helper.make_node("Mul", [inp, f"{out}_factor"], [out])],
        "scale",
        [value(inp, elem, shape)],
        [value(out, elem, shape)],
        [helper.make_tensor(f"{out}_factor", elem, [1], [factor])],
    )


def not_graph(inp: str, out: str, shape: Sequence[int | str]) -> onnx.GraphProto:
    """out = not inp, BOOL."""
    return helper.make_graph(
        [helper.make_node("Not", [inp], [out])],
        "not",
        [value(inp, TensorProto.BOOL, shape)],
        [value(out, TensorProto.BOOL, shape)],
    )


def sum_and_diff_graph() -> onnx.GraphProto:
    """sum = a + b and diff = a - b, FP32 [batch, 4]."""
    return helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["diff"]),
        ],
        "two_inputs",
        [value("a", F, [BATCH, 4]), value("b", F, [BATCH, 4])],
        [value("sum", F, [BATCH, 4]), value("diff", F, [BATCH, 4])],
    )


def sum_and_copy_graph() -> onnx.GraphProto:
    """sum = a (FP32) + b (INT32), and b_copy = b, [batch, 4]."""
    return helper.make_graph(
        [
            helper.make_node("Cast", ["b"], ["bf"], to=F),
            helper.make_node("Add", ["a", "bf"], ["sum"]),
            helper.make_node("Identity", ["b"], ["b_copy"]),
        ],
        "two_inputs",
        [value("a", F, [BATCH, 4]), value("b", TensorProto.INT32, [BATCH, 4])],
        [value("sum", F, [BATCH, 4]), value("b_copy", TensorProto.INT32, [BATCH, 4])],
    )


def widen_graph(times: int) -> onnx.GraphProto:
    """y = x repeated `times` times along its row: [batch, 4] -> [batch, 4 * times]."""
    return helper.make_graph(
        [helper.make_node("Tile", ["x", "reps"], ["y"])],
        "widen",
        [value("x", F, [BATCH, 4])],
        [value("y", F, [BATCH, 4 * times])],
        [helper.make_tensor("reps", I64, [2], [1, times])],
    )


def fails_on_even_batches() -> onnx.GraphProto:
    """Echoes x [N, 4]; its graph reshapes 4N+4 values to rows of 8, which fails when N is even.

    Warm-up runs batches of 1 and max_batch_size; with an odd max_batch_size the model loads,
    and a batch with an even number of rows makes onnxruntime raise at run time.
    """
    return helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "flat"], ["xf"]),
            helper.make_node("Concat", ["xf", "pad"], ["padded"], axis=0),
            helper.make_node("Reshape", ["padded", "rows8"], ["r"]),
            helper.make_node("ReduceSum", ["r"], ["s"], keepdims=0),
            helper.make_node("Mul", ["s", "zero"], ["z"]),
            helper.make_node("Add", ["x", "z"], ["y"]),
        ],
        "fails_even",
        [value("x", F, [BATCH, 4])],
        [value("y", F, [BATCH, 4])],
        [
            helper.make_tensor("flat", I64, [1], [-1]),
            helper.make_tensor("pad", F, [4], [0.0] * 4),
            helper.make_tensor("rows8", I64, [2], [-1, 8]),
            helper.make_tensor("zero", F, [], [0.0]),
        ],
    )


def fragile_graph(bad_rows: int) -> onnx.GraphProto:
    """y = x [N, 4], through a Reshape whose target is one element off when N == bad_rows."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["n"]),
        helper.make_node("Equal", ["n", "bad"], ["is_bad"]),
        helper.make_node("Cast", ["is_bad"], ["off"], to=I64),
        helper.make_node("Mul", ["n", "width"], ["size"]),
        helper.make_node("Add", ["size", "off"], ["flat_shape"]),
        helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
        helper.make_node("Reshape", ["flat", "shape"], ["y"]),
    ]
    consts = [
        helper.make_tensor("zero", I64, [1], [0]),
        helper.make_tensor("one", I64, [1], [1]),
        helper.make_tensor("bad", I64, [1], [bad_rows]),
        helper.make_tensor("width", I64, [1], [4]),
    ]
    return helper.make_graph(
        nodes, "fragile", [value("x", F, [BATCH, 4])], [value("y", F, [BATCH, 4])], consts
    )


def heavy_graph(rows: int, width: int, layers: int) -> onnx.GraphProto:
    """[batch, rows, width] through `layers` width x width MatMul+Relu, averaged to
    [batch, width]: compute-bound on purpose (deterministic weights)."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "input"
    for k in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"w{k}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"]))
        nodes.append(helper.make_node("Relu", [f"m{k}"], [f"r{k}"]))
        prev = f"r{k}"
    nodes.append(helper.make_node("ReduceMean", [prev], ["output"], axes=[1], keepdims=0))
    x = value("input", F, [BATCH, rows, width])
    return helper.make_graph(nodes, "heavy", [x], [value("output", F, [BATCH, width])], weights)


@dataclass(frozen=True)
class Mlp:
    """Dense layers with a ReLU between them, y = f(x); the tests compute `reference` in numpy."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]

    @classmethod
    def seeded(cls, seed: int, widths: Sequence[int]) -> Mlp:
        """Deterministic weights and biases for layers of the given widths (input first)."""
        rng = np.random.default_rng(seed)
        layers = tuple(
            (
                rng.standard_normal((n_in, n_out)).astype(np.float32),
                rng.standard_normal(n_out).astype(np.float32),
            )
            for n_in, n_out in itertools.pairwise(widths)
        )
        return cls(layers)

    def reference(self, x: np.ndarray) -> Any:
        """What the graph computes, in numpy."""
        for k, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if k < len(self.layers) - 1:
                x = np.maximum(x, 0.0)
        return x

    def graph(self) -> onnx.GraphProto:
        """x [batch, in] -> y [batch, out]."""
        nodes, weights, prev = [], [], "x"
        for k, (w, b) in enumerate(self.layers):
            last = k == len(self.layers) - 1
            summed = "y" if last else f"a{k}"
            nodes.append(helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"]))
            nodes.append(helper.make_node("Add", [f"m{k}", f"b{k}"], [summed]))
            if not last:
                nodes.append(helper.make_node("Relu", [summed], [f"r{k}"]))
            weights += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
            prev = f"r{k}"
        widths = (self.layers[0][0].shape[0], self.layers[-1][0].shape[1])
        return helper.make_graph(
            nodes,
            "mlp",
            [value("x", F, [BATCH, widths[0]])],
            [value("y", F, [BATCH, widths[1]])],
            weights,
        )
