"""FLOPs, weights and activation sizes of an ONNX model, counted per sample from its graph.

Conventions (docs/zoo.md has the table): a multiply-accumulate is 2 FLOPs; a bias add, an
elementwise op and an activation cost 1 FLOP per output element; Softmax 5 and LayerNorm 7 per
element (the passes they make); pooling one per window element; shape arithmetic and data
movement cost nothing. Activations are every intermediate tensor written once, leaving out
views (Reshape and kin) and tensors computed from constants and shapes alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import onnx
from onnx import shape_inference

from dlscale.models.cost import ModelCost


def _ops(*names: str) -> list[str]:
    return " ".join(names).split()


#: FLOPs per output element.
_ELEMENTWISE: dict[str, float] = dict.fromkeys(
    _ops(
        "Add Sub Mul Div Pow Sqrt Reciprocal Neg Abs Exp Log Erf Tanh Sigmoid HardSigmoid",
        "HardSwish Relu LeakyRelu PRelu Elu Selu Celu Softplus Softsign Mish Clip Max Min Mean",
        "Sum Where Mod Floor Ceil Round Sign Sin Cos Equal Less Greater LessOrEqual",
        "GreaterOrEqual Not And Or Xor CumSum QuantizeLinear DequantizeLinear",
    ),
    1.0,
) | {
    # max, subtract, exp, sum, divide
    "Softmax": 5.0,
    "LogSoftmax": 5.0,
    # the decomposition 0.5·x·(1 + erf(x/√2)): divide, erf, add, two multiplies
    "Gelu": 5.0,
    # inference BatchNorm is a multiply and an add with precomputed scale and shift
    "BatchNormalization": 2.0,
    # mean, subtract, square, sum, normalize, scale, shift
    "LayerNormalization": 7.0,
    "InstanceNormalization": 7.0,
    "GroupNormalization": 7.0,
}
#: Elementwise ops a runtime fuses into the op before them (Conv+BN+ReLU, a GEMM's bias and
#: activation, a residual Add): normalizations over a row and Softmax are written, not fused.
_EPILOGUES = frozenset(
    op for op, cost in _ELEMENTWISE.items() if cost == 1.0 or op in ("BatchNormalization", "Gelu")
)
#: FLOPs per input element.
_REDUCTIONS = frozenset(
    _ops(
        "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceSumSquare",
        "ReduceLogSumExp GlobalAveragePool GlobalMaxPool ArgMax ArgMin",
    )
)
#: Ops that move or reinterpret data and compute nothing.
_MOVEMENT = frozenset(
    _ops(
        "Reshape Flatten Squeeze Unsqueeze Identity Transpose Gather GatherElements GatherND",
        "Concat Split Slice Pad Tile Expand Cast CastLike Shape Size Constant ConstantOfShape",
        "Range DepthToSpace SpaceToDepth Resize Dropout TopK NonZero OneHot ScatterND",
        "ScatterElements Trilu EyeLike",
    )
)
#: Convolutions and the input index of their weight (quantized forms included).
_CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}
#: Matrix products whose first input is A, [..., M, K].
_MATMULS = frozenset(_ops("MatMul MatMulInteger QLinearMatMul"))
#: Outputs that alias their input: no new tensor is written.
_VIEWS = frozenset(_ops("Reshape Flatten Squeeze Unsqueeze Identity Dropout"))

Shape = tuple[int, ...]


def count(model: onnx.ModelProto | Path, dims: Mapping[str, int] | None = None) -> ModelCost:
    """Count a model per sample: symbolic batch dims are set to 1, others from `dims`."""
    if isinstance(model, Path):
        model = onnx.load(model, load_external_data=False)
    shapes = _infer_shapes(model, dict(dims or {}))
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    weight_params = sum(math.prod(t.dims) for t in graph.initializer)
    outputs = {o.name for o in graph.output}
    static = set(weights)  # tensors known without the inputs: computed once, not per sample
    by_op: dict[str, float] = {}
    macs = activations = written = 0.0
    producers: dict[str, str] = {}  # tensor -> the op type that wrote it
    uncounted: set[str] = set()
    for node in graph.node:
        if node.op_type == "Constant":
            weight_params += sum(math.prod(a.t.dims) for a in node.attribute if a.name == "value")
        if node.op_type in ("Constant", "Shape", "Size") or all(
            i in static for i in node.input if i
        ):
            static.update(node.output)
            continue
        out = [shapes.get(name) for name in node.output if name]
        ins = [shapes.get(name) if name else None for name in node.input]
        cost = _node_cost(node, ins, out)
        if cost is None:
            uncounted.add(node.op_type)
            continue
        node_macs, node_flops = cost
        macs += node_macs
        by_op[node.op_type] = by_op.get(node.op_type, 0.0) + node_flops
        producers.update(dict.fromkeys(node.output, node.op_type))
        if node.op_type not in _VIEWS:
            made = sum(
                math.prod(s)
                for name, s in zip(node.output, out, strict=True)
                if s and name not in outputs
            )
            activations += made
            if not _fused(node, producers, static):
                written += made
    io = _elements(shapes.get(v.name) for v in graph.input if v.name not in weights)
    io += _elements(shapes.get(v.name) for v in graph.output)
    return ModelCost(
        flops=sum(by_op.values()),
        macs=macs,
        weight_params=weight_params,
        activation_elements=activations,
        io_elements=io,
        by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
        uncounted=tuple(sorted(uncounted)),
        written_elements=written,
    )


def _fused(node: onnx.NodeProto, producers: Mapping[str, str], static: set[str]) -> bool:
    """Whether a runtime folds this node into the op that wrote its input (an epilogue)."""
    if node.op_type not in _EPILOGUES:
        return False
    first = next((i for i in node.input if i and i not in static), None)
    return first is not None and first in producers


def _node_cost(
    node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape | None]
) -> tuple[float, float] | None:
    """(MACs, FLOPs) of one node, or None when its op or a shape it needs is unknown."""
    op = node.op_type
    if op in _MOVEMENT:
        return 0.0, 0.0
    out = outs[0] if outs else None
    if out is None:
        return None
    n_out = math.prod(out)
    if op in _ELEMENTWISE:
        return 0.0, _ELEMENTWISE[op] * n_out
    if op in _REDUCTIONS:
        return None if ins[0] is None else (0.0, float(math.prod(ins[0])))
    if op in ("MaxPool", "AveragePool", "LpPool"):
        kernel = _attr_ints(node, "kernel_shape")
        return 0.0, float(n_out * math.prod(kernel))
    if op in _CONV_WEIGHT:
        weight = ins[_CONV_WEIGHT[op]] if len(ins) > _CONV_WEIGHT[op] else None
        if weight is None:
            return None
        macs = n_out * math.prod(weight[1:])  # W is [C_out, C_in / group, *kernel]
    elif op == "ConvTranspose":
        if ins[0] is None or len(ins) < 2 or ins[1] is None:
            return None
        macs = math.prod(ins[0]) * math.prod(ins[1][1:])  # W is [C_in, C_out / group, *kernel]
    elif op in _MATMULS:
        if ins[0] is None:
            return None
        macs = n_out * ins[0][-1]
    elif op == "Gemm":
        if ins[0] is None:
            return None
        macs = n_out * ins[0][0 if _attr_int(node, "transA") else 1]
    else:
        return None
    has_bias = op in ("Conv", "ConvTranspose", "Gemm") and len(node.input) > 2 and node.input[2]
    return float(macs), 2.0 * macs + (n_out if has_bias else 0)


def _infer_shapes(model: onnx.ModelProto, dims: dict[str, int]) -> dict[str, Shape]:
    """Every tensor's shape with the batch dim at 1; tensors of unknown shape are left out.

    Shape inference runs on a skeleton of the model: large weights become typed graph inputs,
    so that a 400 MB model is not copied; small integer ones stay, shape arithmetic reads them.
    """
    skeleton = onnx.ModelProto(
        ir_version=model.ir_version,
        opset_import=model.opset_import,
        graph=onnx.GraphProto(name=model.graph.name),
    )
    graph = skeleton.graph
    graph.node.extend(model.graph.node)
    for value in model.graph.input:
        graph.input.append(_fixed_dims(value, dims))
    for value in model.graph.output:
        out = graph.output.add()
        out.name = value.name
        out.type.tensor_type.elem_type = value.type.tensor_type.elem_type
    inputs = {v.name for v in model.graph.input}
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.INT64 or math.prod(tensor.dims) <= 16:
            graph.initializer.append(tensor)
        elif tensor.name not in inputs:
            graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
    inferred = shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True)
    shapes: dict[str, Shape] = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        shape = _concrete(value)
        if shape is not None:
            shapes[value.name] = shape
    return shapes


def _fixed_dims(value: onnx.ValueInfoProto, dims: dict[str, int]) -> onnx.ValueInfoProto:
    """A copy of a graph input with its symbolic leading dim at 1 and named dims from `dims`."""
    fixed = onnx.ValueInfoProto()
    fixed.CopyFrom(value)
    for axis, dim in enumerate(fixed.type.tensor_type.shape.dim):
        if dim.HasField("dim_value"):
            continue
        size = dims.get(dim.dim_param, 1 if axis == 0 else None)
        if size is not None:
            dim.Clear()
            dim.dim_value = size
    return fixed


def _concrete(value: onnx.ValueInfoProto) -> Shape | None:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    sizes = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    return None if any(s < 0 for s in sizes) else tuple(sizes)


def _elements(shapes: Iterable[Shape | None]) -> float:
    return float(sum(math.prod(s) for s in shapes if s is not None))


def _attr_ints(node: onnx.NodeProto, name: str) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == name), [])


def _attr_int(node: onnx.NodeProto, name: str) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), 0)


def count_file(path: Path) -> ModelCost:
    """Count a model file of any backend: ONNX from its graph, a torch file by running it once.

    torch's counter (models/torch_cost.py) counts matrix products, convolutions and attention
    only; the ONNX counter also counts elementwise work.
    """
    if path.suffix == ".onnx":
        return count(path)
    from dlscale.models.torch_cost import count_torch

    return count_torch(path)
