"""CUDA machinery of the torch backend: pinned staging, a side copy stream, CUDA graphs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dlscale.backends.torch.tensors import as_tensor, to_numpy

Step = Callable[..., list[torch.Tensor]]


class _Flat:
    """A growable flat buffer handing out views of any shape from its start."""

    def __init__(self, dtype: torch.dtype, device: torch.device, pinned: bool) -> None:
        self.dtype, self.device, self.pinned = dtype, device, pinned
        self._storage = torch.empty(0, dtype=dtype, device=device, pin_memory=pinned)

    def view(self, shape: Sequence[int]) -> torch.Tensor:
        """A tensor of `shape` over the buffer's first elements (grown when too small)."""
        need = math.prod(shape)
        if need > self._storage.numel():
            self._storage = torch.empty(
                need, dtype=self.dtype, device=self.device, pin_memory=self.pinned
            )
            if not self.pinned:
                # Padding rows read zeros until real data lands there; the zeroing must be
                # done before another stream (copy, compute) touches the buffer.
                self._storage.zero_()
                torch.cuda.current_stream(self.device).synchronize()
        return self._storage[:need].view(tuple(shape))


class Staging:
    """Host↔device copies for one backend: pinned memory, copies on a stream of their own.

    Inputs go host → pinned → device on the copy stream (straight from the caller's memory
    when it is pinned already, as a benchmark's or a loader's can be) and the compute stream
    waits for them by event; outputs come back into pinned memory from PyTorch's caching host
    allocator and are handed out as they are, without another copy. The copies never queue
    behind compute in one stream: with two instances on a device (two backends, two pairs of
    streams), one instance's copies overlap the other's compute.
    """

    def __init__(self, device: torch.device, dtypes: Mapping[str, torch.dtype]) -> None:
        self.device = device
        self.copy_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.compute_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._host = {n: _Flat(d, torch.device("cpu"), pinned=True) for n, d in dtypes.items()}
        self._device = {n: _Flat(d, device, pinned=False) for n, d in dtypes.items()}
        self._uploaded = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._computed = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def device_view(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """The device buffer of input `name` as `shape` (reserves it when called at load)."""
        return self._device[name].view(shape)

    def upload(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Copy arrays into the device buffers' leading elements; compute waits on it.

        Host arrays go through pinned memory unless pinned already (a page-locked system
        shared-memory region is); device arrays (a CUDA region's) are copied on the device.
        """
        with torch.cuda.stream(self.copy_stream):
            for name, array in arrays.items():
                source = as_tensor(array)
                if not source.is_cuda and not source.is_pinned():
                    # A multi-threaded host copy: torch splits large copies over its threads.
                    source = self._host[name].view(array.shape).copy_(source)
                self._device[name].view(array.shape).copy_(source, non_blocking=True)
            self._uploaded.record(self.copy_stream)
        self.compute_stream.wait_event(self._uploaded)

    def download(
        self, outputs: Mapping[str, torch.Tensor], rows: int | None
    ) -> dict[str, np.ndarray]:
        """The first `rows` rows (all, when None) of device outputs, as host numpy arrays.

        Each array is a view of pinned memory that stays the caller's until it is dropped;
        the caching host allocator then takes it back for a later batch.
        """
        self._computed.record(self.compute_stream)
        self.copy_stream.wait_event(self._computed)
        staged = {}
        with torch.cuda.stream(self.copy_stream):
            for name, tensor in outputs.items():
                # No record_stream: `outputs` keeps these tensors alive until the copy stream
                # is synchronized below, so their memory cannot be reused under the copy.
                part = tensor if rows is None else tensor[:rows]
                host = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
                staged[name] = host.copy_(part, non_blocking=True)
        self.copy_stream.synchronize()
        return {name: to_numpy(t) for name, t in staged.items()}

    def keep_on_device(
        self, outputs: Mapping[str, torch.Tensor], rows: int | None
    ) -> dict[str, torch.Tensor]:
        """The first `rows` rows of device outputs as device tensors of their own.

        Cloned (a CUDA graph's outputs are overwritten by its next replay) and complete when
        returned: the caller copies them into CUDA shared memory on another stream.
        """
        with torch.cuda.stream(self.compute_stream):
            kept = {n: (t if rows is None else t[:rows]).clone() for n, t in outputs.items()}
        self.compute_stream.synchronize()
        return kept


class CudaGraphs:
    """One CUDA graph per batch bucket, captured over fixed input buffers.

    All graphs share one memory pool: a replay's outputs are copied out before the next replay
    starts, so one graph's intermediates may reuse another's memory.
    """

    def __init__(self) -> None:
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]] = {}
        self._pool: Any = None

    def capture(
        self,
        bucket: int,
        step: Step,
        args: Sequence[torch.Tensor],
        stream: torch.cuda.Stream,
        warmup_runs: int,
    ) -> None:
        """Warm `step` up on `args` (lazy init, autotuning), then capture it for `bucket`."""
        with torch.cuda.stream(stream):
            for _ in range(warmup_runs):
                step(*args)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: other models keep computing in their own threads while this one
        # captures; the default ("global") would fail their CUDA calls for the duration.
        with torch.cuda.graph(
            graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"
        ):
            outputs = step(*args)
        if self._pool is None:
            self._pool = graph.pool()
        self._graphs[bucket] = (graph, outputs)

    def replay(self, bucket: int) -> list[torch.Tensor]:
        """Rerun the graph of `bucket` on the current stream; its static outputs."""
        graph, outputs = self._graphs[bucket]
        graph.replay()
        return outputs

    @property
    def buckets(self) -> list[int]:
        """The buckets captured so far."""
        return sorted(self._graphs)
