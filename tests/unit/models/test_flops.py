"""FLOP and byte counting against analytic counts: hand-made graphs, the MLP, ResNet-50, BERT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dlscale.errors import InvalidInput
from dlscale.models.cost import ELEMENT_SIZE, ModelCost
from dlscale.models.flops import count


def _graph(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, list[int | str]],
    outputs: dict[str, list[int | str]],
    weights: dict[str, np.ndarray] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(a, n) for n, a in (weights or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_grouped_conv_counts_macs_per_group() -> None:
    # 8 → 16 channels in 4 groups, 3x3 kernel, stride 1, pad 1 on 10x10: each output element
    # sums 8/4 channels × 9 taps; the bias adds one FLOP per output element.
    w = np.zeros((16, 2, 3, 3), np.float32)
    b = np.zeros(16, np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=4, pads=[1, 1, 1, 1])
    cost = count(
        _graph([conv], {"x": ["batch", 8, 10, 10]}, {"y": ["batch", 16, 10, 10]}, {"w": w, "b": b})
    )
    out = 16 * 10 * 10
    assert cost.macs == out * 2 * 9
    assert cost.flops == 2 * out * 2 * 9 + out
    assert cost.weight_params == w.size + b.size
    assert cost.io_elements == 8 * 100 + out
    assert cost.activation_elements == 0  # the only tensor written is the output


def test_batched_matmul_softmax_and_layernorm() -> None:
    # Attention-like: [H, S, D] @ [H, D, S] → [H, S, S], softmax, then LayerNorm over S.
    h, s, d = 4, 16, 8
    nodes = [
        helper.make_node("MatMul", ["q", "k"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("LayerNormalization", ["probs", "g", "beta"], ["y"], axis=-1),
    ]
    weights = {"g": np.ones(s, np.float32), "beta": np.zeros(s, np.float32)}
    model = _graph(
        nodes,
        {"q": ["batch", h, s, d], "k": ["batch", h, d, s]},
        {"y": ["batch", h, s, s]},
        weights,
    )
    cost = count(model)
    assert cost.macs == h * s * s * d
    assert cost.by_op == {
        "MatMul": 2 * h * s * s * d,
        "LayerNormalization": 7 * h * s * s,
        "Softmax": 5 * h * s * s,
    }
    assert cost.activation_elements == 2 * h * s * s  # scores and probs, once each


def test_named_symbolic_dims_come_from_dims() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _graph(nodes, {"x": ["batch", "seq", 4]}, {"y": ["batch", "seq", 4]})
    assert count(model, dims={"seq": 10}).flops == 40
    unknown = count(model)
    assert unknown.flops == 0 and unknown.uncounted == ("Relu",)


def test_integer_matmul_counts_like_matmul() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.UINT8, ["batch", 6, 4])
    b = numpy_helper.from_array(np.zeros((4, 5), np.int8), "b")
    y = helper.make_tensor_value_info("y", TensorProto.INT32, ["batch", 6, 5])
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "g", [a], [y], [b])
    cost = count(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert cost.macs == 6 * 5 * 4 and cost.flops == 2 * 6 * 5 * 4


def test_unknown_ops_are_reported_not_guessed() -> None:
    nodes = [helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")]
    cost = count(_graph(nodes, {"a": [3, 4], "b": [4, 5]}, {"y": [3, 5]}))
    assert cost.uncounted == ("Einsum",) and cost.flops == 0


def test_views_and_shape_arithmetic_write_nothing() -> None:
    shape = np.array([-1, 12], np.int64)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["v"]),
        helper.make_node("Exp", ["v"], ["y"]),
    ]
    cost = count(_graph(nodes, {"x": ["batch", 3, 4]}, {"y": ["batch", 12]}, {"shape": shape}))
    assert cost.activation_elements == 12  # the Relu output; the Reshape is a view
    assert cost.flops == 24


def test_bytes_per_sample_amortizes_weights_over_the_batch() -> None:
    cost = ModelCost(
        flops=1e6,
        macs=4e5,
        weight_params=1000,
        activation_elements=300.0,
        io_elements=20.0,
        by_op={},
    )
    assert cost.bytes_per_sample() == 4 * (1000 + 300 + 20)
    assert cost.bytes_per_sample("fp16", batch=10) == 2 * (100 + 300 + 20)
    assert cost.bytes_per_sample("INT4", batch=1000) == 0.5 * (1 + 300 + 20)
    assert set(ELEMENT_SIZE) == {"fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4"}
    assert cost.arithmetic_intensity("int8", 10) == pytest.approx(1e6 / 420)
    with pytest.raises(InvalidInput, match="fp64"):
        cost.bytes_per_sample("fp64")
    with pytest.raises(InvalidInput):
        cost.bytes_per_sample("fp32", batch=0)


def test_elementwise_ops_after_a_producer_are_fused_and_not_written() -> None:
    w = np.ones((4, 4), np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),  # fused into the MatMul
        helper.make_node("Add", ["r", "x"], ["s"]),  # a residual: fused too
        helper.make_node("Softmax", ["s"], ["p"]),  # a row-wise pass: written
        helper.make_node("MatMul", ["p", "w"], ["y"]),
    ]
    cost = count(_graph(nodes, {"x": ["n", 4]}, {"y": ["n", 4]}, {"w": w}))
    assert cost.activation_elements == 4 * 4  # h, r, s, p
    assert cost.written_elements == 2 * 4  # h and p
    lone = count(
        _graph(
            [helper.make_node("Relu", ["x"], ["y2"]), helper.make_node("Sigmoid", ["y2"], ["y"])],
            {"x": [1, 4]},
            {"y": [1, 4]},
        )
    )
    assert lone.written_elements == 4  # a graph input has no producer to fuse into
    assert ModelCost(0, 0, 10, 5, 1, {}).traffic("fp32").sample_bytes == 4 * (5 + 1)
    assert ModelCost(0, 0, 10, 5, 1, {}, written_elements=2).traffic("fp32").sample_bytes == 4 * 3


def test_mlp_matches_its_analytic_count(small_repo: Path) -> None:
    layers = [(256, 1024), (1024, 1024), (1024, 10)]
    macs = sum(i * o for i, o in layers)
    biases = sum(o for _, o in layers)
    relus = 1024 + 1024
    cost = count(small_repo / "mlp" / "1" / "model.onnx")
    assert cost.macs == macs == 1_320_960
    assert cost.flops == 2 * macs + biases + relus
    assert cost.by_op == {"Gemm": 2 * macs + biases, "Relu": relus}
    assert cost.weight_params == macs + biases
    assert cost.activation_elements == 2 * 1024 + relus  # two hidden Gemm outputs, two ReLUs
    assert cost.written_elements == 2 * 1024  # each ReLU runs in its Gemm's epilogue
    assert cost.io_elements == 256 + 10
    assert cost.uncounted == ()


def test_count_takes_a_path_or_a_proto(small_repo: Path) -> None:
    path = small_repo / "digits" / "1" / "model.onnx"
    assert count(path) == count(onnx.load(path))


@pytest.mark.slow
def test_resnet50_is_4_09_gmac(big_zoo: Path) -> None:
    cost = count(big_zoo / "resnet50" / "1" / "model.onnx")
    assert cost.macs == pytest.approx(4.09e9, rel=0.02)
    assert cost.flops == pytest.approx(8.18e9, rel=0.02)
    # torchvision's 25.56 M parameters, less BatchNorm's, which the export folds into the convs
    assert cost.weight_params == pytest.approx(25.5e6, rel=0.01)
    assert cost.uncounted == ()
    # What a fusing runtime writes: the 53 convolutions' outputs, the max pool's and the global
    # pool's (ReLUs and residual Adds run in the convolutions' epilogues): 11.3 M per image.
    assert cost.written_elements == 11_113_984 + 200_704 + 2048
    assert cost.activation_elements > 2 * cost.written_elements


def _bert_analytic(
    s: int, h: int = 768, heads: int = 12, ffn: int = 3072, layers: int = 12
) -> tuple[int, int]:
    """BERT-base (MACs, FLOPs) at sequence length `s`, by the counter's conventions."""
    d = h // heads
    qkv = 3 * s * h * h
    scores = heads * s * s * d  # QK^T
    av = heads * s * s * d
    attn_out = s * h * h
    ffn_macs = 2 * s * h * ffn
    layer_macs = qkv + scores + av + attn_out + ffn_macs
    pooler = h * h
    macs = layers * layer_macs + pooler  # embeddings are lookups: no MACs
    per_layer_elementwise = (
        3 * s * h  # QKV biases
        + 2 * heads * s * s  # score scaling and mask add
        + 5 * heads * s * s  # softmax
        + s * h
        + s * h
        + 7 * s * h  # output bias, residual, LayerNorm
        + s * ffn
        + 5 * s * ffn  # intermediate bias, GELU (div, erf, add, mul, mul)
        + s * h
        + s * h
        + 7 * s * h  # output bias, residual, LayerNorm
    )
    embeddings = 2 * s * h + 7 * s * h  # word + position, + token type, LayerNorm
    mask = 2 * s  # (1 - mask) * -10000
    pooler_elementwise = h + h  # bias, tanh
    flops = 2 * macs + layers * per_layer_elementwise + embeddings + mask + pooler_elementwise
    return macs, flops


@pytest.mark.slow
def test_bert_base_matches_the_analytic_count(big_zoo: Path) -> None:
    macs, flops = _bert_analytic(128)
    cost = count(big_zoo / "bert-base" / "1" / "model.onnx")
    assert cost.macs == pytest.approx(macs, rel=0.02)
    assert cost.flops == pytest.approx(flops, rel=0.02)
    assert cost.weight_params == pytest.approx(109.5e6, rel=0.01)
    assert cost.uncounted == ()
