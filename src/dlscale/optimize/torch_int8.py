"""INT8 on x86 through PyTorch's PT2E flow: export, X86InductorQuantizer, calibrate, convert."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dlscale.backends.torch.files import SIGNATURE_ENTRY, signature_json
from dlscale.optimize.onnx_variants import RecipeError, calibration_batches
from dlscale.types import TensorSpec

Arrays = dict[str, np.ndarray]


def pt2e_api() -> tuple[Callable[..., Any], Callable[..., Any], Any]:
    """prepare_pt2e, convert_pt2e and a configured X86InductorQuantizer, wherever they live.

    PT2E moved from torch.ao.quantization to torchao (torch 2.13 no longer has it); a
    RecipeError says what to install when neither is there.
    """
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    except ImportError as new_home:
        try:
            from torch.ao.quantization.quantize_pt2e import (
                convert_pt2e,
                prepare_pt2e,
            )
            from torch.ao.quantization.quantizer import (
                x86_inductor_quantizer as xiq,
            )
        except ImportError:
            raise RecipeError(
                f"PT2E quantization is not in torch {torch.__version__} (torch.ao.quantization."
                f"quantize_pt2e is gone) and torchao is not installed ({new_home}); "
                "pip install torchao"
            ) from None
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    return prepare_pt2e, convert_pt2e, quantizer


def quantize_pt2e(
    module: nn.Module, names: Sequence[str], example: Arrays, calibration: Arrays
) -> nn.Module:
    """The module with static INT8 (U8 activations per tensor, S8 weights per channel) as
    X86InductorQuantizer annotates it, its ranges observed on `calibration`.

    The result is a graph of quantize/dequantize steps around FP32 operators; inductor fuses
    them into oneDNN INT8 kernels when it compiles the program.
    """
    prepare_pt2e, convert_pt2e, quantizer = pt2e_api()
    batches = calibration_batches(calibration, names)
    args = tuple(torch.from_numpy(np.ascontiguousarray(example[n])) for n in names)
    batch = torch.export.Dim("batch")
    try:
        with torch.no_grad():
            graph = torch.export.export(
                module.eval(), args, dynamic_shapes=tuple({0: batch} for _ in args)
            ).module()
            prepared = prepare_pt2e(graph, quantizer)
            for feed in batches:
                prepared(*(torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names))
            converted: nn.Module = convert_pt2e(prepared)
    except RecipeError:
        raise
    except Exception as exc:
        raise RecipeError(f"PT2E quantization failed: {type(exc).__name__}: {exc}") from exc
    return converted


def save_quantized(
    module: nn.Module,
    example: Arrays,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    path: Path,
) -> None:
    """Export the quantized graph again (batch dim dynamic) and save it as the backend reads it.

    Not through save_exported: a PT2E graph refuses .eval() (its mode is set by torchao's
    move_exported_model_to_eval, and it is already in eval mode here).
    """
    args = tuple(torch.from_numpy(np.ascontiguousarray(example[s.name])) for s in inputs)
    batch = torch.export.Dim("batch")
    try:
        with torch.no_grad():
            program = torch.export.export(
                module, args, dynamic_shapes=tuple({0: batch} for _ in args)
            )
        torch.export.save(
            program, path, extra_files={SIGNATURE_ENTRY: signature_json(inputs, outputs)}
        )
    except Exception as exc:
        raise RecipeError(
            f"the PT2E INT8 program could not be exported: {type(exc).__name__}: {exc}"
        ) from exc
