"""FLOPs, weights and activation sizes of a torch backend's model file, counted by running it.

`torch.utils.flop_counter.FlopCounterMode` counts the matrix products, convolutions and
attention of one forward pass (2 FLOPs per multiply-accumulate); elementwise work is not
counted, so a torch count is a little below the ONNX counter's for the same model (docs/zoo.md).
Activations are every tensor an op writes, leaving out views. An AOTInductor package cannot be
run op by op; it carries the count made when it was built.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from dlscale.backends.torch.files import LoadedModel, load_model
from dlscale.backends.torch.tensors import torch_dtype
from dlscale.errors import InvalidInput
from dlscale.models.cost import ModelCost
from dlscale.types import TensorSpec


class _Written(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the elements every non-view op writes."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            results = out if isinstance(out, tuple | list) else [out]
            self.elements += sum(t.numel() for t in results if isinstance(t, torch.Tensor))
        return out


def count_torch(path: Path) -> ModelCost:
    """Count one sample of a torch model file (model.zoo, .pt2, .pt, .aoti.pt2) on the CPU."""
    model = load_model(path, torch.device("cpu"))
    io = float(sum(_sample_elements(s) for s in [*model.inputs, *model.outputs]))
    if model.package is not None:
        flops = model.package.flops_per_sample
        if flops is None:
            raise InvalidInput(f"{path}: the package carries no FLOP count")
        return ModelCost(flops, flops / 2, 0, 0.0, io, {}, ("elementwise ops",))
    counter, written = FlopCounterMode(display=False), _Written()
    with torch.inference_mode(), counter, written:
        model.module(*_example(model))
    by_op = {str(op): float(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    flops = float(counter.get_total_flops())
    return ModelCost(
        flops=flops,
        macs=flops / 2,
        weight_params=_weights(model),
        activation_elements=max(0.0, written.elements - io),
        io_elements=io,
        by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
        uncounted=("elementwise ops",),
    )


def _sample_elements(spec: TensorSpec) -> int:
    return math.prod(max(d, 1) for d in spec.shape[1:])


def _example(model: LoadedModel) -> list[torch.Tensor]:
    """One sample of zeros per input (ids of 0 are valid tokens; variable dims 1)."""
    return [
        torch.zeros((1, *(max(d, 1) for d in s.shape[1:])), dtype=torch_dtype(s.datatype))
        for s in model.inputs
    ]


def _weights(model: LoadedModel) -> int:
    module = model.module
    if not isinstance(module, torch.nn.Module):
        return 0
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() for t in tensors if t.is_floating_point())
