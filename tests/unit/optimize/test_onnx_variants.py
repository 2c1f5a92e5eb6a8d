"""The ONNX recipes on a small real conv net: each file loads, runs, and is what it claims."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tests.toolkit.models import save_onnx

from dlscale.optimize.onnx_variants import RecipeError, build_file

RNG = np.random.default_rng(0)


def _net(path: Path) -> Path:
    w = numpy_helper.from_array(RNG.standard_normal((8, 1, 3, 3)).astype(np.float32) * 0.3, "w")
    fc = numpy_helper.from_array(
        RNG.standard_normal((8 * 6 * 6, 10)).astype(np.float32) * 0.1, "fc"
    )
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "w"], ["c"]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"]),
            helper.make_node("MatMul", ["f", "fc"], ["output"]),
        ],
        "small",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        [w, fc],
    )
    return save_onnx(graph, path)


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"input": x})[0])


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _net(tmp_path_factory.mktemp("net") / "model.onnx")


X = RNG.random((16, 1, 8, 8)).astype(np.float32)


@pytest.mark.parametrize("method", ["MinMax", "Entropy", "Percentile"])
def test_static_int8_is_qdq_and_close(source: Path, tmp_path: Path, method: str) -> None:
    dest = tmp_path / "int8.onnx"
    params = {"calibration": method, "per_channel": True}
    build_file("int8-static", params, source, dest, {"input": X})
    ops = {n.op_type for n in onnx.load(str(dest)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    ref, got = _run(source, X), _run(dest, X)
    assert np.abs(ref - got).max() < 0.1 * np.abs(ref).max()
    assert not np.array_equal(ref, got)  # really quantized


def test_dynamic_int8_quantizes_matmul(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dyn.onnx"
    build_file("int8-dynamic", {}, source, dest, None)
    ops = {n.op_type for n in onnx.load(str(dest)).graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops
    ref, got = _run(source, X), _run(dest, X)
    assert np.abs(ref - got).max() < 0.1 * np.abs(ref).max()


def test_fp16_keeps_fp32_inputs_and_outputs(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "fp16.onnx"
    build_file("fp16", {"keep_io_types": True}, source, dest, None)
    model = onnx.load(str(dest))
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(t.data_type == TensorProto.FLOAT16 for t in model.graph.initializer)
    # onnxruntime's CPU provider runs it by casting back to FP32: slow, but the numbers hold.
    ref, got = _run(source, X), _run(dest, X)
    assert np.abs(ref - got).max() < 1e-2 * np.abs(ref).max()


def test_static_without_calibration_or_unknown_recipe_is_an_error(
    source: Path, tmp_path: Path
) -> None:
    with pytest.raises(RecipeError, match="calibration set"):
        build_file("int8-static", {}, source, tmp_path / "x.onnx", None)
    with pytest.raises(RecipeError, match="lacks inputs"):
        build_file("int8-static", {}, source, tmp_path / "x.onnx", {"other": X})
    with pytest.raises(RecipeError, match="unknown recipe"):
        build_file("int4", {}, source, tmp_path / "x.onnx", None)
