"""An engine's matrix products timed alone at a decoder's shapes, for benchmarks/plan_llm_check.py:
the curves (`dlscale.plan.llm_kernels`) that price the weights' share of each pass.

Every layer's weights are allocated, as the model holds them, so that a product at M rows
streams them from memory as a forward pass does (one layer's weights repeated would stay in
the cache); the head is timed apart, over one row per sequence. The kernel is the engine's
own: torch's linear for the transformers engine and the model's forward, and for vLLM the one
its CPU dispatch picks for each weight (`dispatch_cpu_unquantized_gemm`: oneDNN on x86).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.plan.llm import DecoderShape
from dlscale.plan.llm_kernels import KernelCurve, Kernels, layer_products

#: Row counts timed: every small batch (where kernels change), then doubling to a prefill pass
#: (the curve carries the last two counts' slope beyond).
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, 512)
Product = Callable[[torch.Tensor], torch.Tensor]


def torch_product(weight: torch.Tensor) -> Product:
    """torch's linear layer over `weight` (out, in)."""
    return lambda x: torch.nn.functional.linear(x, weight)


def vllm_product(weight: torch.Tensor) -> Product:
    """The product vLLM's CPU model runner dispatches for a linear layer over `weight`."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    linear = layer.cpu_linear
    return lambda x: linear(x, layer.weight, None)


def measure_kernels(
    shape: DecoderShape,
    engine: str,
    now: Callable[[], float],
    device: str = "cpu",
    reps: int = 3,
    rows: tuple[int, ...] = ROWS,
) -> Kernels:
    """The layers' and the head's curves of `shape` on `engine`'s kernels, fastest of `reps`."""
    dtype = getattr(torch, shape.dtype)
    make = vllm_product if engine == "vllm" else torch_product
    generator = torch.Generator().manual_seed(0)

    def weight(out: int, into: int) -> torch.Tensor:
        w = torch.randn(out, into, generator=generator, dtype=torch.float32) * 0.02
        return w.to(device, dtype)

    fused = engine == "vllm"
    layers = [
        [make(weight(o, i)) for o, i in layer_products(shape, fused)] for _ in range(shape.layers)
    ]
    widths = [i for _, i in layer_products(shape, fused)]
    head = make(weight(shape.vocab, shape.hidden))

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def stack(m: int) -> Callable[[], None]:
        inputs = {w: torch.randn(m, w, generator=generator).to(device, dtype) for w in set(widths)}

        def run() -> None:
            for products in layers:
                for product, width in zip(products, widths, strict=True):
                    product(inputs[width])

        return run

    def logits(m: int) -> Callable[[], None]:
        x = torch.randn(m, shape.hidden, generator=generator).to(device, dtype)

        def run() -> None:
            head(x)

        return run

    def timed(prepare: Callable[[int], Callable[[], None]]) -> KernelCurve:
        runs = {m: prepare(m) for m in rows}
        best = {m: float("inf") for m in rows}
        for _ in range(reps):
            for m, run in runs.items():
                # Run once untimed: a pass follows passes of its own size, not the largest
                # count's (timed right after 512 rows, one row of llama-tiny's took 2-3x).
                run()
                sync()
                start = now()
                run()
                sync()
                best[m] = min(best[m], now() - start)
        return KernelCurve(rows, tuple(best[m] for m in rows))

    with torch.inference_mode():
        return Kernels(timed(stack), timed(logits))
