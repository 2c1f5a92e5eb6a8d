"""CUDA machinery of the torch backend: pinned staging, copy streams, batches in flight, graphs."""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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


class _Slot:
    """One batch in flight: its pinned host and device input buffers and its events."""

    def __init__(self, device: torch.device, dtypes: Mapping[str, torch.dtype]) -> None:
        self.host = {n: _Flat(d, torch.device("cpu"), pinned=True) for n, d in dtypes.items()}
        self.device = {n: _Flat(d, device, pinned=False) for n, d in dtypes.items()}
        self.uploaded = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.computed = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self.downloaded = torch.cuda.Event()  # type: ignore[no-untyped-call]


@dataclass
class Download:
    """Outputs on their way into pinned host memory; `wait` hands them out as numpy arrays."""

    event: torch.cuda.Event
    staged: dict[str, torch.Tensor]
    #: The device outputs the copies read: held until the copies are done.
    sources: Mapping[str, torch.Tensor]

    def wait(self) -> dict[str, np.ndarray]:
        """Block until this batch's copies are done (not the device's other work)."""
        self.event.synchronize()
        return {name: to_numpy(t) for name, t in self.staged.items()}


class Staging:
    """Host↔device copies for one backend, with `slots` batches in flight at once.

    Each batch takes a slot: its inputs go host → pinned → the slot's device buffers on the
    upload stream (straight from the caller's memory when it is pinned already, as a
    benchmark's or a loader's can be) while the previous batch computes; the compute stream
    waits for them by event. Outputs come back on a download stream of their own into pinned
    memory from PyTorch's caching host allocator and are handed out as they are. With two
    slots one instance overlaps its copies with its compute; a second instance is not needed
    for that.
    """

    def __init__(self, device: torch.device, dtypes: Mapping[str, torch.dtype], slots: int) -> None:
        self.device = device
        self.upload_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.download_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.compute_stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self._slots = [_Slot(device, dtypes) for _ in range(slots)]
        self._free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        for slot in self._slots:
            self._free.put(slot)
        #: Static inputs that CUDA graphs are captured over.
        self._graph_inputs = {n: _Flat(d, device, pinned=False) for n, d in dtypes.items()}
        # Compute and the download that follows it are enqueued by one batch at a time, so a
        # graph replay never overwrites outputs that are still being copied out.
        self._compute_lock = threading.Lock()

    def reserve(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """Grow every buffer to the largest batch before serving (graphs hold addresses)."""
        for name, shape in shapes.items():
            self._graph_inputs[name].view(shape)
            for slot in self._slots:
                slot.device[name].view(shape)
                slot.host[name].view(shape)

    def slot_view(self, slot: _Slot, name: str, shape: Sequence[int]) -> torch.Tensor:
        """The slot's device buffer of input `name` as `shape` (a batch padded to its bucket)."""
        return slot.device[name].view(shape)

    def graph_input(self, name: str, shape: Sequence[int]) -> torch.Tensor:
        """The static device buffer of input `name` that graphs read, as `shape`."""
        return self._graph_inputs[name].view(shape)

    @contextlib.contextmanager
    def slot(self) -> Iterator[_Slot]:
        """A free slot for one batch (waits while every slot is in flight)."""
        slot = self._free.get()
        try:
            yield slot
        finally:
            self._free.put(slot)

    def upload(self, slot: _Slot, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Copy arrays into the slot's device buffers; the views, ready once computed on.

        Host arrays go through pinned memory unless pinned already (a page-locked system
        shared-memory region is); device arrays (a CUDA region's) are copied on the device.
        """
        views = {}
        with torch.cuda.stream(self.upload_stream):
            for name, array in arrays.items():
                source = as_tensor(array)
                if not source.is_cuda and not source.is_pinned():
                    # A multi-threaded host copy: torch splits large copies over its threads.
                    source = slot.host[name].view(array.shape).copy_(source)
                views[name] = slot.device[name].view(array.shape)
                views[name].copy_(source, non_blocking=True)
            slot.uploaded.record(self.upload_stream)
        return views

    @contextlib.contextmanager
    def computing(self, slot: _Slot) -> Iterator[torch.cuda.Stream]:
        """Enqueue one batch's compute (and its download) on the compute stream, in order."""
        with self._compute_lock, torch.cuda.stream(self.compute_stream):
            self.compute_stream.wait_event(slot.uploaded)
            yield self.compute_stream

    def download(
        self,
        slot: _Slot,
        outputs: Mapping[str, torch.Tensor],
        rows: int | None,
        *,
        static: bool,
    ) -> Download:
        """Enqueue the copy of the first `rows` rows (all, when None) of each output to the host.

        Call inside `computing`. `static` outputs (a graph's) are overwritten by the next
        replay, so the compute stream waits for their copy before it goes on.
        """
        slot.computed.record(self.compute_stream)
        self.download_stream.wait_event(slot.computed)
        staged = {}
        with torch.cuda.stream(self.download_stream):
            for name, tensor in outputs.items():
                # No record_stream: the Download holds `outputs` until its copies are done.
                part = tensor if rows is None else tensor[:rows]
                host = torch.empty(part.shape, dtype=part.dtype, pin_memory=True)
                staged[name] = host.copy_(part, non_blocking=True)
            slot.downloaded.record(self.download_stream)
        if static:
            self.compute_stream.wait_event(slot.downloaded)
        return Download(slot.downloaded, staged, outputs)

    def keep_on_device(
        self, slot: _Slot, outputs: Mapping[str, torch.Tensor], rows: int | None
    ) -> tuple[torch.cuda.Event, dict[str, torch.Tensor]]:
        """The first `rows` rows of device outputs as device tensors of their own (for CUDA
        shared memory); call inside `computing`, and wait on the event before handing them out.

        Cloned on the compute stream: a graph's outputs are overwritten by its next replay.
        """
        kept = {n: (t if rows is None else t[:rows]).clone() for n, t in outputs.items()}
        slot.computed.record(self.compute_stream)
        return slot.computed, kept


class CudaGraphs:
    """One CUDA graph per batch bucket, captured over fixed input buffers.

    All graphs share one memory pool: replays run one at a time on one stream and a replay's
    outputs are copied out before the next one starts, so one graph's intermediates may reuse
    another's memory.
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
