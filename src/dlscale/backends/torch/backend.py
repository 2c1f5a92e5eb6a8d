"""PyTorch backend: export programs, TorchScript or zoo modules, eager, compiled or graphed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlscale.backends.base import BackendOptions
from dlscale.backends.torch.buckets import Buckets, default_buckets, pad_rows
from dlscale.backends.torch.cuda import CudaGraphs, Staging, Step
from dlscale.backends.torch.device import place
from dlscale.backends.torch.files import LoadedModel, load_model
from dlscale.backends.torch.options import SELF_CAPTURING_MODES, TorchOptions, parse_torch_options
from dlscale.backends.torch.precision import (
    Fp8Linear,
    PrecisionPlan,
    apply_precision,
    check_supported,
    fp32_mode,
)
from dlscale.backends.torch.tensors import from_numpy, is_on_device, to_numpy, torch_dtype
from dlscale.errors import BackendError, ConfigError, DlscaleError, InvalidInput
from dlscale.types import TensorSpec

log = logging.getLogger(__name__)


class TorchBackend:
    """One model on one device; `load` compiles and captures every bucket before serving."""

    def __init__(self, path: Path, options: BackendOptions) -> None:
        self.path = Path(path)
        self.options = options
        self.settings: TorchOptions = parse_torch_options(options.extra)
        self.device: torch.device | None = None
        self.buckets: Buckets | None = None
        self._model: LoadedModel | None = None
        self._module: Any = None
        self._plan: PrecisionPlan | None = None
        self._fn: Step | None = None
        self._staging: Staging | None = None
        self._graphs: CudaGraphs | None = None
        self._held = contextlib.ExitStack()
        #: The device whose memory this backend takes inputs from in place ("cuda:N"), so that
        #: CUDA shared-memory inputs reach it without a trip through the host; None on the CPU.
        self.device_buffers: str | None = None

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the model onto its device, set its precision and layout, compile and capture."""
        try:
            self._load()
        except BaseException:
            self.unload()
            raise

    def _load(self) -> None:
        s = self.settings
        if self.options.intra_op_threads > 0:
            torch.set_num_threads(self.options.intra_op_threads)
        device = self.device = place(self.options.device)
        check_supported(s.precision, device)
        if s.cuda_graphs and device.type != "cuda":
            raise ConfigError(
                "backend_options.cuda_graphs: needs a CUDA device; on the CPU, "
                "static_buckets = true pads batches to buckets the same way"
            )
        self._held.enter_context(fp32_mode(s.precision, device))
        model = self._model = load_model(self.path, device)
        self._check_fits(model)
        plan = self._plan = PrecisionPlan(s.precision, s.autocast, device.type)
        module = apply_precision(model.module, plan)  # type: ignore[arg-type]
        if s.precision == "fp8" and not any(isinstance(m, Fp8Linear) for m in module.modules()):
            raise ConfigError(f"{self.path}: precision 'fp8' found no Linear layer to run in FP8")
        if s.channels_last:
            module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self._module = module
        if s.bucketed:
            self.buckets = Buckets(s.batch_buckets or default_buckets(self.options.max_batch_size))
            if self.buckets.largest < self.options.max_batch_size:
                raise ConfigError(
                    f"backend_options.batch_buckets: the largest, {self.buckets.largest}, is "
                    f"below max_batch_size {self.options.max_batch_size}"
                )
        self._fn = self._compiled() if s.compile else self._step
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: tune each conv once
            dtypes = {spec.name: torch_dtype(spec.datatype) for spec in model.inputs}
            self._staging = Staging(device, dtypes)
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.device_buffers = f"cuda:{index}"
        with torch.inference_mode():
            self._warm_up()
        log.info(
            "loaded %s on %s: %s%s, buckets %s",
            self.path,
            device,
            s.precision,
            " compiled" if s.compile else "",
            self.buckets.sizes if self.buckets else "none",
        )

    def _check_fits(self, model: LoadedModel) -> None:
        s = self.settings
        if s.compile and model.kind == "torchscript":
            raise ConfigError(
                f"{self.path}: torch.compile does not take TorchScript; give a model.pt2 or "
                "model.zoo, or set compile = false"
            )
        if s.precision == "fp8" and model.kind != "module":
            raise ConfigError(
                f"{self.path}: precision 'fp8' swaps nn.Linear modules, which only a model.zoo "
                "module has (an exported or scripted graph has none left)"
            )
        if s.bucketed:
            if self.options.max_batch_size < 1 and s.batch_buckets is None:
                raise ConfigError(
                    "backend_options: batch buckets need max_batch_size > 0 or batch_buckets"
                )
            variable = [i.name for i in model.inputs if -1 in i.shape[1:]]
            if variable:
                raise ConfigError(
                    f"{self.path}: batch buckets need fixed non-batch dimensions; inputs "
                    f"{variable} have variable ones"
                )
        if s.channels_last and not any(len(i.shape) == 4 for i in model.inputs):
            raise ConfigError(
                "backend_options.channels_last: needs a 4-D (N, C, H, W) input; this model "
                f"has {[list(i.shape) for i in model.inputs]}"
            )

    def _compiled(self) -> Step:
        s = self.settings
        if self.buckets is not None:
            # One graph per bucket: raise dynamo's recompile limit so none falls back to eager.
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, 2 * len(self.buckets.sizes) + 8)
        compiled = torch.compile(
            self._step,
            mode=s.compile_mode,
            backend=s.compile_backend,
            dynamic=False if self.buckets is not None else None,
        )
        return compiled

    def _warm_up(self) -> None:
        """Compile and capture every shape a batch may take, so the first request is fast."""
        model, s = self._model, self.settings
        assert model is not None
        if self.buckets is not None:
            sizes: list[int | None] = list(reversed(self.buckets.sizes))
        elif self.options.max_batch_size > 0:
            # Batch 1 is specialized by torch.compile; the second size makes the batch dynamic.
            sizes = [1, 2] if s.compile and self.options.max_batch_size > 1 else [1]
        else:
            sizes = [None]
        if self._staging is not None and self.buckets is not None:
            # Reserve the device buffers at the largest bucket: graphs hold their addresses.
            for spec in model.inputs:
                self._staging.device_view(spec.name, (self.buckets.largest, *spec.shape[1:]))
        if s.cuda_graphs:
            self._capture()
        for size in sizes:
            try:
                self.infer(_zeros(model.inputs, size))
            except DlscaleError as exc:
                hint = "" if s.autocast else " (autocast = true may help with mixed dtypes)"
                raise ConfigError(
                    f"{self.path}: the model failed its warm-up at batch {size} with "
                    f"precision {s.precision!r}{hint}: {exc}"
                ) from exc

    def _capture(self) -> None:
        assert self._staging is not None and self.buckets is not None and self._fn is not None
        assert self._model is not None
        self._graphs = CudaGraphs()
        # Largest first: the shared memory pool is sized by the first capture.
        for bucket in reversed(self.buckets.sizes):
            args = [
                self._staging.device_view(spec.name, (bucket, *spec.shape[1:]))
                for spec in self._model.inputs
            ]
            self._graphs.capture(
                bucket, self._fn, args, self._staging.compute_stream, self.settings.warmup_runs
            )

    # -- computing -------------------------------------------------------------------------------

    def _step(self, *args: torch.Tensor) -> list[torch.Tensor]:
        """The model between the boundary conversions: what is compiled and captured."""
        assert self._plan is not None and self._model is not None
        with self._plan.context():
            converted = [self._prepare(a) for a in args]
            result = self._module(*converted)
        outputs = _as_list(result, [o.name for o in self._model.outputs])
        return [
            out.to(torch_dtype(spec.datatype))
            for out, spec in zip(outputs, self._model.outputs, strict=True)
        ]

    def _prepare(self, tensor: torch.Tensor) -> torch.Tensor:
        assert self._plan is not None
        tensor = self._plan.convert_input(tensor)
        if self.settings.channels_last and tensor.dim() == 4:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    def _call(self, args: list[torch.Tensor]) -> list[torch.Tensor]:
        assert self._fn is not None and self.device is not None
        s = self.settings
        if s.compile and s.compile_mode in SELF_CAPTURING_MODES and self.device.type == "cuda":
            # Tells inductor's CUDA graphs that the previous call's outputs are no longer read.
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        return self._fn(*args)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch: padded to its bucket, converted at the boundary, every output back."""
        model = self._model
        if model is None or self._fn is None:
            raise BackendError(f"{self.path}: infer called before load")
        arrays = _checked_inputs(model.inputs, inputs)
        rows = self._rows(arrays)
        target = rows if self.buckets is None or rows is None else self.buckets.pick(rows)
        try:
            with torch.inference_mode():
                if self._staging is not None:
                    return self._infer_cuda(arrays, rows, target)
                return self._infer_cpu(arrays, rows, target)
        except DlscaleError:
            raise
        except Exception as exc:
            raise BackendError(f"torch failed on a batch of {rows}: {exc}") from exc

    def _rows(self, arrays: list[np.ndarray]) -> int | None:
        if self.options.max_batch_size == 0 and self.buckets is None:
            return None
        sizes = {a.shape[0] for a in arrays}
        if len(sizes) != 1:
            raise InvalidInput(f"inputs disagree on batch size: {sorted(sizes)}")
        return int(sizes.pop())

    def _infer_cpu(
        self, arrays: list[np.ndarray], rows: int | None, target: int | None
    ) -> dict[str, np.ndarray]:
        assert self._model is not None
        tensors = [from_numpy(a) for a in arrays]
        if target is not None and target != rows:
            tensors = [pad_rows(t, target) for t in tensors]
        outputs = self._call(tensors)
        return {
            spec.name: to_numpy(out if rows is None else out[:rows])
            for spec, out in zip(self._model.outputs, outputs, strict=True)
        }

    def _infer_cuda(
        self, arrays: list[np.ndarray], rows: int | None, target: int | None
    ) -> dict[str, np.ndarray]:
        staging, model = self._staging, self._model
        assert staging is not None and model is not None
        staging.upload({spec.name: a for spec, a in zip(model.inputs, arrays, strict=True)})
        with torch.cuda.stream(staging.compute_stream):
            if self._graphs is not None:
                assert target is not None
                outputs = self._graphs.replay(target)
            else:
                args = [
                    staging.device_view(spec.name, (target, *a.shape[1:]) if target else a.shape)
                    for spec, a in zip(model.inputs, arrays, strict=True)
                ]
                outputs = self._call(args)
        named = {spec.name: out for spec, out in zip(model.outputs, outputs, strict=True)}
        if any(is_on_device(a) for a in arrays):
            # Device in, device out: outputs may go to CUDA shared memory without the host.
            return staging.keep_on_device(named, rows)  # type: ignore[return-value]
        return staging.download(named, rows)

    # -- description and teardown ------------------------------------------------------------------

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._model.inputs if self._model else []

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._model.outputs if self._model else []

    def unload(self) -> None:
        """Drop the module, graphs and buffers; give back the process-wide precision claim."""
        on_cuda = self.device is not None and self.device.type == "cuda"
        self._fn = self._module = self._graphs = self._staging = None
        self._model = None
        self.device_buffers = None
        self._held.close()
        if on_cuda:
            torch.cuda.empty_cache()


def _as_list(result: Any, names: list[str]) -> list[torch.Tensor]:
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


def _checked_inputs(specs: list[TensorSpec], inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The inputs in the model's order; names and datatypes must be the model's."""
    wanted = [s.name for s in specs]
    if sorted(inputs) != sorted(wanted):
        raise InvalidInput(f"the model takes inputs {wanted}, got {sorted(inputs)}")
    arrays = []
    for spec in specs:
        array = inputs[spec.name]
        if array.dtype != spec.datatype.numpy:
            raise InvalidInput(
                f"input {spec.name!r} is {array.dtype}, the model takes {spec.datatype.value}"
            )
        arrays.append(array)
    return arrays


def _zeros(specs: list[TensorSpec], batch: int | None) -> dict[str, np.ndarray]:
    """Warm-up inputs: zeros, batch dim `batch` (None: the spec's own), variable dims 1."""
    out = {}
    for spec in specs:
        dims = [max(d, 1) for d in spec.shape]
        if batch is not None:
            dims[0] = batch
        out[spec.name] = np.zeros(dims, dtype=spec.datatype.numpy)
    return out
