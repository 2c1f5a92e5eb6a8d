"""PyTorch backend: AOTInductor packages, export programs, TorchScript or zoo modules."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlscale.backends.base import BackendOptions, Capabilities
from dlscale.backends.torch.boundary import inductor_options
from dlscale.backends.torch.buckets import Buckets, default_buckets, pad_rows
from dlscale.backends.torch.cuda import CudaGraphs, Staging, Step
from dlscale.backends.torch.device import place
from dlscale.backends.torch.files import LoadedModel, load_model
from dlscale.backends.torch.options import SELF_CAPTURING_MODES, TorchOptions, parse_torch_options
from dlscale.backends.torch.precision import check_supported, fp32_mode
from dlscale.backends.torch.prepare import (
    check_fits,
    check_package,
    precision_of,
    prepared,
    resolved_options,
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
        #: The model's tensors, read at load.
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self._module: Any = None
        self._fn: Step | None = None
        self._staging: Staging | None = None
        #: The device whose memory this backend takes inputs from in place ("cuda:N"), so that
        #: CUDA shared-memory inputs reach it without a trip through the host; None on the CPU.
        self.device_buffers: str | None = None
        self._graphs: CudaGraphs | None = None
        self._held = contextlib.ExitStack()

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the model onto its device, set its precision and layout, compile and capture."""
        try:
            self._load()
        except BaseException:
            self.unload()
            raise

    def _load(self) -> None:
        if self.options.intra_op_threads > 0:
            torch.set_num_threads(self.options.intra_op_threads)
        device = self.device = place(self.options.device)
        # A package's runner is called by one thread at a time (the compute lock), and CUDA
        # graph capture needs it without its own locking.
        model = self._model = load_model(self.path, device, single_threaded=True)
        self.inputs, self.outputs = model.inputs, model.outputs
        check_package(self.path, model, self.options.extra)
        s = self.settings = resolved_options(
            self.settings, model, device, self.options.max_batch_size
        )
        precision = precision_of(s, model)
        check_supported(precision, device)  # type: ignore[arg-type]
        if device.type != "cuda" and s.cuda_graphs:
            raise ConfigError(
                "backend_options.cuda_graphs: needs a CUDA device; on the CPU, "
                "static_buckets = true pads batches to buckets the same way"
            )
        if device.type != "cuda" and (s.inflight_batches or 1) > 1:
            raise ConfigError(
                "backend_options.inflight_batches: more than one batch at once overlaps copies "
                "with compute on a CUDA device; on the CPU it is 1"
            )
        self._held.enter_context(fp32_mode(precision, device))  # type: ignore[arg-type]
        check_fits(self.path, model, s, self.options.max_batch_size)
        if s.bucketed:
            self.buckets = Buckets(s.batch_buckets or default_buckets(self.options.max_batch_size))
            if self.buckets.largest < self.options.max_batch_size:
                raise ConfigError(
                    f"backend_options.batch_buckets: the largest, {self.buckets.largest}, is "
                    f"below max_batch_size {self.options.max_batch_size}"
                )
        if model.kind == "aoti":
            runner = model.module
            self._module = runner
            self._fn = lambda *args: list(runner(*args))
        else:
            self._module = prepared(model, s, device)
            self._fn = self._compiled(self._module) if s.compile else self._module
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: tune each conv once
            dtypes = {spec.name: torch_dtype(spec.datatype) for spec in model.inputs}
            self._staging = Staging(device, dtypes, s.inflight_batches or 1)
            index = device.index if device.index is not None else torch.cuda.current_device()
            self.device_buffers = f"cuda:{index}"
        with torch.inference_mode():
            self._warm_up()
        log.info(
            "loaded %s on %s: %s%s%s, buckets %s",
            self.path,
            device,
            precision,
            " compiled" if s.compile or model.kind == "aoti" else "",
            " with CUDA graphs" if self._graphs else "",
            self.buckets.sizes if self.buckets else "none",
        )

    def _compiled(self, module: torch.nn.Module) -> Step:
        s = self.settings
        if self.buckets is not None:
            # One graph per bucket: raise dynamo's recompile limit so none falls back to eager.
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, 2 * len(self.buckets.sizes) + 8)
        dynamic = False if self.buckets is not None else None
        if s.compile_backend == "inductor":
            options = inductor_options(s.compile_mode, bool(s.freezing))
            return torch.compile(module, backend="inductor", options=options, dynamic=dynamic)
        return torch.compile(
            module, mode=s.compile_mode, backend=s.compile_backend, dynamic=dynamic
        )

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
            # Every buffer at the largest batch up front: graphs hold their addresses.
            largest = self.buckets.largest
            self._staging.reserve({i.name: (largest, *i.shape[1:]) for i in model.inputs})
        if s.cuda_graphs:
            self._capture()
        for size in sizes:
            try:
                self.infer(_zeros(model.inputs, size))
            except DlscaleError as exc:
                hint = "" if s.autocast else " (autocast = true may help with mixed dtypes)"
                raise ConfigError(
                    f"{self.path}: the model failed its warm-up at batch {size} with "
                    f"precision {precision_of(s, model)!r}{hint}: {exc}"
                ) from exc

    def _capture(self) -> None:
        assert self._staging is not None and self.buckets is not None and self._fn is not None
        assert self._model is not None
        self._graphs = CudaGraphs()
        # Largest first: the shared memory pool is sized by the first capture.
        for bucket in reversed(self.buckets.sizes):
            args = [
                self._staging.graph_input(spec.name, (bucket, *spec.shape[1:]))
                for spec in self._model.inputs
            ]
            self._graphs.capture(
                bucket, self._fn, args, self._staging.compute_stream, self.settings.warmup_runs
            )

    # -- computing -------------------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """Read after load: batches at once (2 on CUDA by default, 1 on the CPU), and the CUDA
        device it reads inputs from in place."""
        concurrency = (self.settings.inflight_batches or 1) if self._staging is not None else 1
        return Capabilities(concurrency=concurrency, device_buffers=self.device_buffers)

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
        names = [spec.name for spec in model.inputs]
        # Device in, device out: outputs may go to CUDA shared memory without the host.
        on_device = any(is_on_device(a) for a in arrays)
        with staging.slot() as slot:
            views = staging.upload(slot, dict(zip(names, arrays, strict=True)))
            with staging.computing(slot):
                if self._graphs is not None:
                    assert target is not None and rows is not None
                    for name, view in views.items():
                        staging.graph_input(name, view.shape).copy_(view)
                    outputs = self._graphs.replay(target)
                else:
                    # Padding rows are whatever the slot's buffer held: rows are independent.
                    args = [
                        staging.slot_view(slot, n, (target, *views[n].shape[1:]))
                        if target is not None
                        else views[n]
                        for n in names
                    ]
                    outputs = self._call(args)
                named = {spec.name: out for spec, out in zip(model.outputs, outputs, strict=True)}
                if on_device:
                    done, kept = staging.keep_on_device(slot, named, rows)
                else:
                    pending = staging.download(slot, named, rows, static=self._graphs is not None)
            if on_device:
                done.synchronize()
                return kept  # type: ignore[return-value]
            return pending.wait()

    # -- teardown --------------------------------------------------------------------------------

    def unload(self) -> None:
        """Drop the module, graphs and buffers; give back the process-wide precision claim."""
        on_cuda = self.device is not None and self.device.type == "cuda"
        self._fn = self._module = self._graphs = self._staging = None
        self._model = None
        self.inputs, self.outputs = [], []
        self.device_buffers = None
        self._held.close()
        if on_cuda:
            torch.cuda.empty_cache()


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
