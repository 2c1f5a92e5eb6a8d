"""Tiny ONNX models for bench tests: identity, and a deliberately broken copy that adds 1."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper


def write_model(root: Path, name: str, add: float = 0.0, max_batch_size: int = 64) -> Path:
    """REPO/<name>/config.toml and 1/model.onnx: FP32 [batch, 4] in, same out (plus `add`)."""
    folder = root / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])
    if add:
        one = helper.make_tensor("addend", TensorProto.FLOAT, [], [add])
        node = helper.make_node("Add", ["INPUT0", "addend"], ["OUTPUT0"])
        graph = helper.make_graph([node], name, [x], [y], [one])
    else:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name, [x], [y]
        )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, folder / "model.onnx")
    (root / name / "config.toml").write_text(
        f"max_batch_size = {max_batch_size}\n[batching]\nmax_queue_delay_us = 200\n"
    )
    return folder / "model.onnx"


def build_repo(root: Path) -> Path:
    """A repository with `identity` and `broken` (identity + 1, for accuracy tests)."""
    write_model(root, "identity")
    write_model(root, "broken", add=1.0)
    return root
