"""What one sample costs a model (FLOPs, weights, elements moved), whichever counter measured it.

The ONNX counter (flops.py) and the PyTorch counter (torch_cost.py) both return a ModelCost;
it lives here, below both, so that they never import each other's module to share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlscale.errors import InvalidInput
from dlscale.types import Traffic

#: Bytes per element at each precision.
ELEMENT_SIZE: dict[str, float] = {
    "fp32": 4,
    "tf32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
}


@dataclass(frozen=True)
class ModelCost:
    """What one sample costs a model, in arithmetic and in elements moved."""

    flops: float
    macs: float
    weight_params: int
    activation_elements: float
    io_elements: float
    by_op: dict[str, float]
    #: Op types whose cost is not counted: unknown ops, or outputs of unknown shape.
    uncounted: tuple[str, ...] = field(default=())
    #: Activations a fusing runtime writes: elementwise ops after a producer (BatchNorm, ReLU,
    #: a residual Add) are folded into it, so their outputs never reach memory. None: all of
    #: activation_elements. The roofline counts these, so that its ceiling stays an upper bound.
    written_elements: float | None = None

    def traffic(self, precision: str = "fp32") -> Traffic:
        """Bytes moved: the weights once per batch, written activations and I/O per sample."""
        try:
            size = ELEMENT_SIZE[precision.lower()]
        except KeyError:
            known = ", ".join(ELEMENT_SIZE)
            raise InvalidInput(f"unknown precision {precision!r}; known: {known}") from None
        written = (
            self.activation_elements if self.written_elements is None else self.written_elements
        )
        return Traffic(size * self.weight_params, size * (written + self.io_elements))

    def bytes_per_sample(self, precision: str = "fp32", batch: int = 1) -> float:
        """Bytes moved per sample: weights read once per batch, activations and I/O once each."""
        return self.traffic(precision).per_sample(batch)

    def arithmetic_intensity(self, precision: str = "fp32", batch: int = 1) -> float:
        """FLOPs per byte moved, the roofline's x axis."""
        return self.flops / self.bytes_per_sample(precision, batch)
