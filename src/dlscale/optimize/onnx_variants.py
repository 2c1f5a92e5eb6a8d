"""Recipes that turn an FP32 ONNX file into a variant's file: FP16, static and dynamic INT8."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from dlscale.errors import OptimizeError
from dlscale.models.signature import onnx_signature

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
#: Rows per calibration batch: small enough for ResNet-50 activations to fit in memory.
CALIBRATION_BATCH = 8
#: Percentile calibration keeps this share of each activation's histogram.
PERCENTILE = 99.999


class RecipeError(OptimizeError):
    """A variant's file could not be built (the search reports it and goes on)."""


def build_file(
    recipe: str,
    params: Mapping[str, object],
    source: Path,
    dest: Path,
    calibration: Arrays | None,
) -> None:
    """Write the variant's model file at `dest` from the FP32 `source`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if recipe == "copy":
        shutil.copyfile(source, dest)
    elif recipe == "fp16":
        to_fp16(source, dest, keep_io_types=bool(params.get("keep_io_types", True)))
    elif recipe == "int8-static":
        if calibration is None:
            raise RecipeError("static INT8 needs a calibration set")
        quantize_int8_static(
            source,
            dest,
            calibration,
            method=str(params.get("calibration", "MinMax")),
            per_channel=bool(params.get("per_channel", True)),
        )
    elif recipe == "int8-dynamic":
        quantize_int8_dynamic(source, dest)
    else:
        raise RecipeError(f"unknown recipe {recipe!r}")


def to_fp16(source: Path, dest: Path, *, keep_io_types: bool = True) -> None:
    """Weights and compute in FP16; with keep_io_types the served tensors stay FP32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(source))
    # Casts are inserted at the inputs and outputs when keep_io_types is set, so clients and
    # the config keep their FP32 signature.
    converted = convert_float_to_float16(model, keep_io_types=keep_io_types)
    onnx.save(converted, str(dest))


def calibration_batches(data: Arrays, names: Sequence[str]) -> list[Arrays]:
    """The calibration rows of inputs `names`, CALIBRATION_BATCH at a time (views, no copies);
    RecipeError when the set lacks one of them."""
    missing = [n for n in names if n not in data]
    if missing:
        raise RecipeError(f"the calibration set lacks inputs {missing} (has {sorted(data)})")
    rows = len(data[names[0]])
    return [
        {n: data[n][start : start + CALIBRATION_BATCH] for n in names}
        for start in range(0, rows, CALIBRATION_BATCH)
    ]


class _Reader:
    """Feeds calibration rows to onnxruntime's calibrator in small batches."""

    def __init__(self, data: Arrays, input_names: list[str]) -> None:
        self._batches = iter(calibration_batches(data, input_names))

    def get_next(self) -> Arrays | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # the calibrator API asks for it; one pass is all it takes
        raise NotImplementedError


def quantize_int8_static(
    source: Path,
    dest: Path,
    calibration: Arrays,
    *,
    method: str = "MinMax",
    per_channel: bool = True,
) -> None:
    """QDQ INT8: U8 activations calibrated on `calibration`, S8 weights per channel.

    U8 activations with S8 weights is the pairing onnxruntime's x86 kernels (VNNI) are fastest
    with; the graph is pre-processed first (shape inference, fusions) as onnxruntime advises.
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if method not in CalibrationMethod.__members__:
        raise RecipeError(
            f"calibration {method!r}: expected one of {list(CalibrationMethod.__members__)}"
        )
    input_names = [spec.name for spec in onnx_signature(source)[0]]
    with tempfile.TemporaryDirectory(prefix="dlscale-quant-") as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=False)
        except Exception as exc:  # symbolic shape inference gives up on some graphs
            log.info("pre-processing skipped for %s: %s", source, exc)
            shutil.copyfile(source, prepared)
        extra: dict[str, object] = {"CalibTensorRangeSymmetric": False}
        if method == "Percentile":
            extra["CalibPercentile"] = PERCENTILE
        try:
            quantize_static(
                str(prepared),
                str(dest),
                _Reader(calibration, input_names),
                quant_format=QuantFormat.QDQ,
                per_channel=per_channel,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod[method],
                extra_options=extra,
            )
        except RecipeError:
            raise
        except Exception as exc:
            raise RecipeError(f"static quantization ({method}) failed: {exc}") from exc


def quantize_int8_dynamic(source: Path, dest: Path) -> None:
    """Dynamic INT8: weights of MatMul/Gemm quantized ahead, activations at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        quantize_dynamic(
            str(source),
            str(dest),
            op_types_to_quantize=["MatMul", "Gemm"],
            weight_type=QuantType.QInt8,
        )
    except Exception as exc:
        raise RecipeError(f"dynamic quantization failed: {exc}") from exc
