"""The model between its boundary conversions: what is compiled, captured and packaged.

Clients keep speaking the model's declared datatypes (FP32, FP16, UINT8 pixels, INT64 ids);
inside, floating-point inputs become the compute dtype (channels-last when 4-D and asked for)
and every output its declared datatype. Keeping those conversions inside one module means
torch.compile fuses them, a CUDA graph captures them, and an AOTInductor package holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from dlscale.backends.torch.precision import PrecisionPlan
from dlscale.backends.torch.tensors import torch_dtype
from dlscale.errors import ConfigError
from dlscale.types import TensorSpec


class Boundary(nn.Module):
    """`model` with its inputs converted to the compute dtype and its outputs to the declared."""

    def __init__(
        self,
        model: Callable[..., Any],
        plan: PrecisionPlan,
        channels_last: bool,
        outputs: Sequence[TensorSpec],
    ) -> None:
        super().__init__()
        # An nn.Module is registered (its weights move and cast with the boundary); a callable
        # that is not one (a TorchScript function) is kept as it is.
        self.model = model
        self.plan = plan
        self.channels_last = channels_last
        self.output_names = [o.name for o in outputs]
        self.output_dtypes = [torch_dtype(o.datatype) for o in outputs]
        # Serving only. Set directly: .eval() would recurse into an exported program's module,
        # which refuses train().
        self.training = False

    def forward(self, *args: torch.Tensor) -> list[torch.Tensor]:
        with self.plan.context():
            result = self.model(*[self._prepare(a) for a in args])
        outputs = as_list(result, self.output_names)
        return [out.to(dtype) for out, dtype in zip(outputs, self.output_dtypes, strict=True)]

    def _prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = self.plan.convert_input(tensor)
        if self.channels_last and tensor.dim() == 4:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor


def as_list(result: Any, names: list[str]) -> list[torch.Tensor]:
    """A model's outputs in signature order, whether it returns one tensor, a tuple or a dict."""
    if isinstance(result, torch.Tensor):
        outputs = [result]
    elif isinstance(result, Mapping):
        outputs = [result[name] for name in names]
    else:
        outputs = list(result)
    if len(outputs) != len(names):
        raise ConfigError(
            f"the model returned {len(outputs)} outputs, its signature names {len(names)}: {names}"
        )
    return outputs


def inductor_options(mode: str, freezing: bool) -> dict[str, Any]:
    """Inductor's settings for a torch.compile mode, with freezing on or off.

    torch.compile takes a mode or an options table, not both, and AOTInductor takes only the
    table; this expands the mode into its table (the one place that does), so a compiled model
    and a packaged one get the same settings.
    """
    from torch._inductor import list_mode_options

    options: dict[str, Any] = dict(list_mode_options(mode))
    if freezing:
        options["freezing"] = True
    return options


def has_convolution(module: Any) -> bool:
    """Whether a module (or an exported program's module) runs 2-D convolutions."""
    if isinstance(module, nn.Module) and any(isinstance(m, nn.Conv2d) for m in module.modules()):
        return True
    graph = getattr(module, "graph", None)
    if graph is None or not hasattr(graph, "nodes"):
        return False
    return any("convolution" in str(getattr(n, "target", "")) for n in graph.nodes)
