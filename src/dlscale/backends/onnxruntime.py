"""ONNX Runtime backend: CPU, or CUDA and TensorRT providers where onnxruntime-gpu sees a GPU."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from dlscale.backends.base import BackendOptions, Capabilities
from dlscale.errors import BackendError, ConfigError, InvalidInput
from dlscale.types import Datatype, TensorSpec
from dlscale.wire.tensors import as_bytes, as_text

log = logging.getLogger(__name__)

_ORT_TYPES: dict[str, Datatype] = {
    "tensor(bool)": Datatype.BOOL,
    "tensor(uint8)": Datatype.UINT8,
    "tensor(uint16)": Datatype.UINT16,
    "tensor(uint32)": Datatype.UINT32,
    "tensor(uint64)": Datatype.UINT64,
    "tensor(int8)": Datatype.INT8,
    "tensor(int16)": Datatype.INT16,
    "tensor(int32)": Datatype.INT32,
    "tensor(int64)": Datatype.INT64,
    "tensor(float16)": Datatype.FP16,
    "tensor(bfloat16)": Datatype.BF16,
    "tensor(float)": Datatype.FP32,
    "tensor(double)": Datatype.FP64,
    "tensor(string)": Datatype.BYTES,
}
_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def providers_for(device: str, extra: Mapping[str, Any]) -> list[Any]:
    """Execution providers for a device, most capable first; raises when the device is absent."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ConfigError(
            f"device {device!r} needs onnxruntime's CUDA provider, which this onnxruntime build "
            f"lacks (providers: {available}); install onnxruntime-gpu or use device 'cpu'"
        )
    # A MIG UUID is made visible to this process as its only device, which is then index 0.
    device_id = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    chosen: list[Any] = []
    if extra.get("tensorrt") and "TensorrtExecutionProvider" in available:
        trt = {"device_id": device_id, "trt_fp16_enable": bool(extra.get("trt_fp16", False))}
        chosen.append(("TensorrtExecutionProvider", trt))
    chosen.append(("CUDAExecutionProvider", {"device_id": device_id}))
    chosen.append("CPUExecutionProvider")
    return chosen


def _spec(arg: Any) -> TensorSpec:
    dtype = _ORT_TYPES.get(arg.type)
    if dtype is None:
        raise ConfigError(f"tensor {arg.name!r} has type {arg.type}, which dlscale cannot serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
    return TensorSpec(arg.name, dtype, shape)


def _to_runtime(name: str, array: np.ndarray) -> np.ndarray:
    """Arrays as onnxruntime takes them: BYTES elements as str (it would str() bytes: "b'..'")."""
    if array.dtype != object:
        return array
    try:
        return np.vectorize(as_text, otypes=[object])(array) if array.size else array
    except UnicodeDecodeError:
        raise InvalidInput(
            f"BYTES input {name!r} holds bytes that are not UTF-8; onnxruntime string tensors "
            "take UTF-8 text only"
        ) from None


def _from_runtime(array: np.ndarray) -> np.ndarray:
    """String outputs back as the protocol's BYTES elements (UTF-8 bytes)."""
    if array.dtype != object or not array.size:
        return array
    converted: np.ndarray = np.vectorize(as_bytes, otypes=[object])(array)
    return converted


class OnnxRuntimeBackend:
    """One InferenceSession; `run` releases the GIL, so instances compute in parallel threads."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        if options.graph_optimization_level not in _OPT_LEVELS:
            raise ConfigError(
                f"graph_optimization_level {options.graph_optimization_level!r}: expected one "
                f"of {list(_OPT_LEVELS)}"
            )
        self.path = Path(path)
        self.options = options
        self._session: ort.InferenceSession | None = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []

    def load(self) -> None:
        """Create the session on the configured device and read its signature."""
        so = ort.SessionOptions()
        so.graph_optimization_level = _OPT_LEVELS[self.options.graph_optimization_level]
        so.intra_op_num_threads = self.options.intra_op_threads
        so.inter_op_num_threads = self.options.inter_op_threads
        # Threads spin while idle by default; with many instances on few cores that spinning
        # steals the cores other instances compute on.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = providers_for(self.options.device, self.options.extra)
        try:
            self._session = ort.InferenceSession(str(self.path), so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors for bad files
            raise ConfigError(f"{self.path}: onnxruntime cannot load it: {exc}") from exc
        self._inputs = [_spec(a) for a in self._session.get_inputs()]
        self._outputs = [_spec(a) for a in self._session.get_outputs()]
        log.debug("loaded %s with providers %s", self.path, self._session.get_providers())

    @property
    def capabilities(self) -> Capabilities:
        """One batch at a time, on host arrays."""
        return Capabilities()

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._outputs

    @property
    def providers(self) -> list[str]:
        """The execution providers the session really uses."""
        return self._session.get_providers() if self._session else []

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; every output is returned."""
        if self._session is None:
            raise BackendError(f"{self.path}: infer called before load")
        names = [o.name for o in self._outputs]
        feed = {n: _to_runtime(n, a) for n, a in inputs.items()}
        try:
            results = self._session.run(names, feed)
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError) as exc:
            raise InvalidInput(f"the model refused the inputs: {exc}") from exc
        except Exception as exc:
            raise BackendError(f"onnxruntime failed: {exc}") from exc
        return {n: _from_runtime(r) for n, r in zip(names, results, strict=True)}

    def unload(self) -> None:
        """Drop the session (its memory is freed when the last reference goes)."""
        self._session = None
