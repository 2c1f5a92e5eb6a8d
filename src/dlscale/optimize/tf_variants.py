"""A TensorFlow model's candidates: TensorFlow itself (with and without XLA), and ONNX Runtime
on the model converted by tf2onnx, whose files then get the usual ONNX variants (FP32, INT8).

The source variant is `tf-fp32`, the model as served; every other candidate must beat it within
the same tolerance on the same held-out inputs (docs/optimize.md, TensorFlow models).
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import onnx
from onnx import helper

from dlscale.errors import OptimizeError
from dlscale.native import run_child, stderr_tail
from dlscale.optimize.decide import TF_SOURCE_VARIANT
from dlscale.optimize.variants import Variant

#: The prefix of ONNX Runtime variants made from a TensorFlow model ("onnx-fp32", ...).
ONNX_PREFIX = "onnx-"
#: The ONNX opset tf2onnx converts to (onnxruntime's quantizer handles it).
OPSET = 17
#: Seconds a conversion may take before it is given up (tf2onnx on a large model is slow).
CONVERT_TIMEOUT_S = 600


def tensorflow_variants() -> list[Variant]:
    """TensorFlow as it is, and with XLA compilation (jit_compile), which fuses elementwise ops
    into the matmuls and convolutions around them."""
    return [
        Variant(TF_SOURCE_VARIANT, "fp32", "tf-copy", runtime="tensorflow"),
        Variant(
            "tf-xla", "fp32", "tf-copy", backend_options={"jit_compile": True}, runtime="tensorflow"
        ),
    ]


def as_converted(variants: list[Variant]) -> list[Variant]:
    """ONNX variants renamed for a converted model: `onnx-fp32` is not the source."""
    return [replace(v, name=ONNX_PREFIX + v.name) for v in variants]


def convert(source: Path, signature: str, outputs: list[str], target: Path) -> Path:
    """The model as an FP32 ONNX file at `target`, converted by tf2onnx in a child process
    (its graph rewrites stay out of the optimizer's TensorFlow); OptimizeError with its reason.

    A .keras file is exported as a SavedModel first (tf2onnx reads SavedModels); its outputs
    are then named `output_<i>`, and are renamed back to the served model's `outputs`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tf2onnx-") as scratch:
        saved = source
        if source.suffix == ".keras":
            saved = Path(scratch) / "model.savedmodel"
            _run([sys.executable, "-c", _EXPORT, str(source), str(saved)], "exporting .keras")
        command = [sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(saved)]
        command += ["--signature_def", signature, "--opset", str(OPSET), "--output", str(target)]
        _run(command, "tf2onnx")
    _name_outputs(target, outputs)
    return target


def _name_outputs(path: Path, names: list[str]) -> None:
    """Give the ONNX graph's outputs, in order, the served model's names (Identity nodes)."""
    model = onnx.load(str(path))
    current = [o.name for o in model.graph.output]
    if current == names:
        return
    if len(current) != len(names):
        raise OptimizeError(f"tf2onnx made outputs {current}; the model has {names}")
    for old, new, value in zip(current, names, list(model.graph.output), strict=True):
        model.graph.node.append(helper.make_node("Identity", [old], [new]))
        value.name = new
    onnx.save(model, str(path))


#: Exports a .keras file as a SavedModel whose serving signature keeps the model's tensor names.
_EXPORT = """
import sys
import dlscale.backends.tensorflow
import keras
model = keras.saving.load_model(sys.argv[1], compile=False, safe_mode=True)
model.export(sys.argv[2], verbose=False)
"""


def _run(command: list[str], what: str) -> None:
    timed_out = f"{what} took over {CONVERT_TIMEOUT_S} s; gave up"
    done = run_child(command, CONVERT_TIMEOUT_S, OptimizeError, timed_out)
    if done.returncode != 0:
        raise OptimizeError(f"{what} failed: {stderr_tail(done)}")
