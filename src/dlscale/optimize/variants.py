"""The candidate variants of a model for one device, and the ones the device cannot run (why)."""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import onnx
import psutil

from dlscale.errors import ConfigError

#: Calibration methods compared for static INT8 (onnxruntime.quantization.CalibrationMethod).
CALIBRATIONS = ("MinMax", "Entropy", "Percentile")
#: Ops whose weights dominate compute in a transformer; dynamic INT8 quantizes these.
_MATMUL_OPS = {"MatMul", "Gemm"}
_CONV_OPS = {"Conv", "ConvTranspose"}


@dataclass(frozen=True)
class DeviceCaps:
    """What the target device can do, as far as choosing variants needs to know."""

    device: str
    cores: int
    cpu_flags: frozenset[str] = frozenset()
    ort_providers: tuple[str, ...] = ()
    #: CUDA compute capability (major, minor); None on a CPU target.
    cuda_capability: tuple[int, int] | None = None
    #: Whether PyTorch is installed (the torch backend and its variants need it).
    torch: bool = False

    @property
    def is_cuda(self) -> bool:
        return self.device != "cpu"

    @property
    def int8_cpu_fast(self) -> bool:
        """Whether the CPU has INT8 dot-product instructions (VNNI or AMX) that make INT8 pay."""
        return bool(self.cpu_flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def detect_caps(device: str = "auto") -> DeviceCaps:
    """The capabilities of `device` (auto: the first CUDA GPU onnxruntime sees, else the CPU)."""
    import onnxruntime as ort

    providers = tuple(ort.get_available_providers())
    has_cuda = "CUDAExecutionProvider" in providers
    if device == "auto":
        device = "cuda:0" if has_cuda else "cpu"
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"device {device!r}: expected auto, cpu or cuda:N")
    if device != "cpu" and not has_cuda:
        raise ConfigError(
            f"device {device!r}: this onnxruntime build has no CUDA provider "
            f"(providers: {list(providers)}); install onnxruntime-gpu or use --device cpu"
        )
    return DeviceCaps(
        device=device,
        cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        cpu_flags=_cpu_flags(),
        ort_providers=providers,
        cuda_capability=_cuda_capability(device) if device != "cpu" else None,
        torch=importlib.util.find_spec("torch") is not None,
    )


def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _cuda_capability(device: str) -> tuple[int, int] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


@dataclass(frozen=True)
class ModelFacts:
    """What the model's graph says about which variants make sense."""

    op_counts: Mapping[str, int]
    #: Some input is 4-D (N, C, H, W): a layout change may apply.
    image_input: bool
    #: Token-id inputs or attention ops: a transformer.
    transformer: bool

    @property
    def has_conv(self) -> bool:
        return any(self.op_counts.get(op, 0) for op in _CONV_OPS)

    @property
    def has_matmul(self) -> bool:
        return any(self.op_counts.get(op, 0) for op in _MATMUL_OPS)


def model_facts(model_file: Path) -> ModelFacts:
    """Read the graph's op counts and input ranks (weights are not loaded)."""
    model = onnx.load(str(model_file), load_external_data=False)
    counts = Counter(node.op_type for node in model.graph.node)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    ranks = [len(i.type.tensor_type.shape.dim) for i in inputs]
    names = {i.name for i in inputs}
    transformer = bool(names & {"input_ids", "attention_mask"}) or counts.get("Softmax", 0) > 1
    return ModelFacts(dict(counts), any(r == 4 for r in ranks), transformer)


@dataclass(frozen=True)
class Variant:
    """One way to run the model: how its file is built and the runtime settings it runs with."""

    name: str
    precision: str
    #: Recipe that makes this variant's file from the FP32 one: copy, fp16, int8-static or
    #: int8-dynamic.
    recipe: str
    #: Recipe parameters (calibration method, keep_io_types...).
    params: Mapping[str, Any] = field(default_factory=dict)
    #: Values for config.toml's [backend_options].
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    runtime: str = "onnxruntime"
    #: Whether the numbers may change beyond rounding (the guard decides if they are kept).
    lossy: bool = False

    def tuned(self, suffix: str, **options: Any) -> Variant:
        """The same file with other runtime settings."""
        merged = {**self.backend_options, **options}
        return replace(self, name=f"{self.name}+{suffix}", backend_options=merged)


@dataclass(frozen=True)
class Skipped:
    """A variant not tried on this device, and why."""

    name: str
    reason: str


def precision_variants(
    facts: ModelFacts, caps: DeviceCaps, *, has_calibration: bool
) -> tuple[list[Variant], list[Skipped]]:
    """Stage one: the file-changing variants (precision, quantization) this device can run."""
    base = {"graph_optimization_level": "all"}
    tried = [Variant("fp32", "fp32", "copy", backend_options=base)]
    skipped: list[Skipped] = []
    if caps.is_cuda:
        tried.append(Variant("fp16", "fp16", "fp16", {"keep_io_types": True}, base, lossy=True))
        if "TensorrtExecutionProvider" in caps.ort_providers:
            trt = {**base, "tensorrt": True}
            tried.append(Variant("trt-fp32", "fp32", "copy", backend_options=trt))
            tried.append(
                Variant(
                    "trt-fp16",
                    "fp16",
                    "copy",
                    backend_options={**trt, "trt_fp16": True},
                    lossy=True,
                )
            )
        else:
            skipped.append(Skipped("trt-*", "onnxruntime has no TensorRT provider here"))
    else:
        skipped.append(
            Skipped(
                "fp16",
                "the CPU provider has no FP16 kernels for x86; onnxruntime would cast every "
                "node back to FP32",
            )
        )
    int8_ok, why_not = _int8_supported(caps)
    if not int8_ok:
        skipped.append(Skipped("int8-*", why_not))
        return tried, skipped
    if has_calibration and (facts.has_conv or facts.has_matmul):
        for method in CALIBRATIONS:
            tried.append(
                Variant(
                    f"int8-static-{method.lower()}",
                    "int8",
                    "int8-static",
                    {"calibration": method, "per_channel": True},
                    base,
                    lossy=True,
                )
            )
    elif not has_calibration:
        skipped.append(Skipped("int8-static-*", "the model has no calibration data"))
    if facts.has_matmul and not facts.has_conv:
        tried.append(Variant("int8-dynamic", "int8", "int8-dynamic", {}, base, lossy=True))
    else:
        skipped.append(
            Skipped("int8-dynamic", "dynamic INT8 is for MatMul-bound (transformer) models")
        )
    return tried, skipped


def _int8_supported(caps: DeviceCaps) -> tuple[bool, str]:
    if caps.is_cuda:
        # onnxruntime's CUDA provider runs QDQ graphs by falling back to the CPU for most
        # quantized ops; INT8 on a GPU pays only through TensorRT.
        if "TensorrtExecutionProvider" in caps.ort_providers:
            return True, ""
        return False, "INT8 on a GPU needs onnxruntime's TensorRT provider"
    if not caps.cpu_flags & {"avx2", "avx512f", "avx512_vnni", "amx_int8"} and caps.cpu_flags:
        return False, "the CPU lacks AVX2, which onnxruntime's INT8 kernels need"
    return True, ""


def runtime_variants(
    best: Variant, facts: ModelFacts, caps: DeviceCaps
) -> tuple[list[Variant], list[Skipped]]:
    """Stage two: runtime settings (graph level, threads, layout) on the best stage-one file."""
    tried = [
        best.tuned("opt-basic", graph_optimization_level="basic"),
        best.tuned("opt-extended", graph_optimization_level="extended"),
    ]
    skipped: list[Skipped] = []
    if caps.cores > 1:
        half = max(1, caps.cores // 2)
        tried.append(best.tuned(f"threads-{half}", intra_op_threads=half))
    else:
        skipped.append(Skipped(f"{best.name}+threads", "one core: nothing to divide"))
    if facts.image_input and caps.is_cuda:
        tried.append(best.tuned("nhwc", prefer_nhwc=True))
    elif facts.image_input:
        skipped.append(
            Skipped(
                f"{best.name}+nhwc",
                "the CPU provider already picks its blocked NCHWc layout (and NHWC for INT8 "
                "convolutions) at graph level 'all'",
            )
        )
    return tried, skipped
