"""Small real ONNX models, written with onnx.helper, in a repository for the serving tests."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper


def write_model(folder: Path, graph: onnx.GraphProto, config: str, version: int = 1) -> None:
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, folder / str(version) / "model.onnx")
    (folder / "config.toml").write_text(config)


def identity_graph(width: int = 16) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"])],
        "identity",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", width])],
    )


def add_graph(value: float) -> onnx.GraphProto:
    return helper.make_graph(
        [helper.make_node("Add", ["input", "c"], ["output"])],
        "add",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor("c", TensorProto.FLOAT, [1], [value])],
    )


PLUS = "max_batch_size = 8\n[version_policy]\nall = true\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_model(tmp_path / "identity", identity_graph(), "max_batch_size = 32\n")
    write_model(tmp_path / "plus", add_graph(1.0), PLUS)
    write_model(tmp_path / "plus", add_graph(2.0), PLUS, version=2)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.toml").write_text("max_batch_size = -3\n")
    return tmp_path
