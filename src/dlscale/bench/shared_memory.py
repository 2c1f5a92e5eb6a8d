"""The bench's shared-memory path (as perf_analyzer's --shared-memory): regions it creates itself.

Each request in flight takes a slot: one input region and one output region, created and
registered once (a slot grows, and is registered again, only when a request outgrows it). Every
query fills its slot's input region with its own rows, inside the measured loop, so the client's
copy is measured as perf_analyzer measures it; the answer names the output region, and the
outputs are copied out of it before the slot is reused. `close` unregisters and destroys every
region, also after an error. System regions are POSIX shared-memory objects (/dev/shm/KEY, as
tritonclient makes them); CUDA regions are device memory shared through a cudaIpcMemHandle.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from dlscale.errors import BenchError
from dlscale.serving.regions.system import shm_path
from dlscale.types import (
    Datatype,
    InferenceRequest,
    InferenceResponse,
    RegionRef,
    RegionTensor,
    RequestedOutput,
    TensorSpec,
)

KINDS = ("none", "system", "cuda")
_ALIGN = 64  # each tensor starts on a cache line


class RegionClient(Protocol):
    """What a protocol client offers the pool: the register calls and one inference."""

    async def register_region(self, kind: str, name: str, memory: Any) -> None: ...

    async def unregister_region(self, kind: str, name: str) -> None: ...

    async def infer_request(self, request: InferenceRequest) -> InferenceResponse: ...


class HostBuffer:
    """A POSIX shared-memory object this process creates, maps, and unlinks at the end."""

    def __init__(self, key: str, byte_size: int) -> None:
        self.key, self.byte_size = key, byte_size
        path = shm_path(key)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, byte_size)
            self._mmap = mmap.mmap(fd, byte_size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)

    def write(self, offset: int, array: np.ndarray) -> None:
        """Copy an array's bytes in at `offset`."""
        flat: Any = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # numpy lacks Buffer
        self._mmap[offset : offset + flat.size] = memoryview(flat)

    def read(self, offset: int, placed: RegionTensor) -> np.ndarray:
        """A copy of a tensor the server wrote at `offset`."""
        count = math.prod(placed.shape)
        view = np.frombuffer(self._mmap, placed.datatype.numpy, count, offset)
        return view.reshape(placed.shape).copy()

    def destroy(self) -> None:
        """Unmap and unlink."""
        self._mmap.close()
        os.unlink(shm_path(self.key))


class DeviceBuffer:
    """Device memory this process allocates and shares through a cudaIpcMemHandle."""

    def __init__(self, device_id: int, byte_size: int) -> None:
        try:
            import cupy
        except ImportError:
            raise BenchError(
                "--shared-memory cuda needs CuPy: pip install 'dlscale[gpu]'"
            ) from None
        self._cupy, self._rt = cupy, cupy.cuda.runtime
        self.device_id, self.byte_size = device_id, byte_size
        with cupy.cuda.Device(device_id):
            self._ptr = int(self._rt.malloc(byte_size))
        self.handle = bytes(self._rt.ipcGetMemHandle(self._ptr))

    def write(self, offset: int, array: np.ndarray) -> None:
        """Copy an array's bytes in at `offset` (host to device)."""
        flat = np.ascontiguousarray(array)
        with self._cupy.cuda.Device(self.device_id):
            self._rt.memcpy(self._ptr + offset, flat.ctypes.data, flat.nbytes, 1)
            # From pageable memory cudaMemcpy may return once the bytes are staged, before they
            # land; the server (another process) reads them as soon as the request arrives.
            self._rt.deviceSynchronize()

    def read(self, offset: int, placed: RegionTensor) -> np.ndarray:
        """A host copy of a tensor the server wrote at `offset`."""
        out = np.empty(placed.shape, placed.datatype.numpy)
        self._rt.memcpy(out.ctypes.data, self._ptr + offset, out.nbytes, 2)
        return out

    def destroy(self) -> None:
        """Free the device memory."""
        self._rt.free(self._ptr)


Buffer = HostBuffer | DeviceBuffer


class _Slot:
    """One request's input and output regions, and where each tensor goes in them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.regions: dict[str, Buffer] = {}  # "in" and "out" once created


class RegionPool:
    """Slots of regions for the requests in flight, over one client (CUDA ones on GPU 0)."""

    def __init__(
        self,
        kind: str,
        client: RegionClient,
        outputs: tuple[TensorSpec, ...],
        output_size: int | None = None,
    ) -> None:
        if kind not in ("system", "cuda"):
            raise BenchError(f"--shared-memory {kind!r}: expected one of {', '.join(KINDS)}")
        self.kind, self.client, self.outputs = kind, client, outputs
        self.output_size = output_size
        self._free: list[_Slot] = []
        self._all: list[_Slot] = []

    async def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], version: str = ""
    ) -> dict[str, np.ndarray]:
        """One query through a slot: fill its input region, ask, copy the outputs out."""
        slot = self._free.pop() if self._free else self._new_slot()
        try:
            rows = next(iter(inputs.values())).shape[0] if inputs else 1
            in_place = _layout({n: a.nbytes for n, a in inputs.items()})
            out_place = _layout({s.name: self._output_bytes(s, rows) for s in self.outputs})
            await self._fit(slot, "in", in_place)
            await self._fit(slot, "out", out_place)
            request = self._request(slot, model, version, inputs, in_place, out_place)
            response = await self.client.infer_request(request)
            return self._read(slot, response)
        finally:
            self._free.append(slot)

    async def close(self) -> None:
        """Unregister and destroy every region (errors on the way out are not the run's)."""
        for slot in self._all:
            for role, buffer in slot.regions.items():
                # The server may be gone; the memory is still ours to free.
                with contextlib.suppress(Exception):
                    await self.client.unregister_region(self.kind, f"{slot.name}-{role}")
                buffer.destroy()
            slot.regions.clear()
        self._all.clear()
        self._free.clear()

    # -- internals ---------------------------------------------------------------------------------

    def _new_slot(self) -> _Slot:
        slot = _Slot(f"dlscale-bench-{os.getpid()}-{len(self._all)}")
        self._all.append(slot)
        return slot

    def _output_bytes(self, spec: TensorSpec, rows: int) -> int:
        if self.output_size is not None:
            return self.output_size
        dims = spec.shape[1:] if spec.shape and spec.shape[0] == -1 else spec.shape
        if any(d < 0 for d in dims) or spec.datatype is Datatype.BYTES:
            raise BenchError(
                f"output {spec.name!r} ({spec.described()}) has no fixed "
                "size: give --output-shm-size BYTES"
            )
        return rows * math.prod(dims) * spec.datatype.itemsize

    async def _fit(self, slot: _Slot, role: str, layout: dict[str, tuple[int, int]]) -> None:
        need = max((offset + size for offset, size in layout.values()), default=1)
        current = slot.regions.get(role)
        if current is not None and current.byte_size >= need:
            return
        name = f"{slot.name}-{role}"
        if current is not None:
            await self.client.unregister_region(self.kind, name)
            current.destroy()
            del slot.regions[role]
        system = self.kind == "system"
        buffer: Buffer = HostBuffer(f"/{name}", need) if system else DeviceBuffer(0, need)
        slot.regions[role] = buffer
        await self.client.register_region(self.kind, name, buffer)

    def _request(
        self,
        slot: _Slot,
        model: str,
        version: str,
        inputs: Mapping[str, np.ndarray],
        in_place: dict[str, tuple[int, int]],
        out_place: dict[str, tuple[int, int]],
    ) -> InferenceRequest:
        in_name, out_name = f"{slot.name}-in", f"{slot.name}-out"
        placed = {}
        for name, array in inputs.items():
            offset, size = in_place[name]
            slot.regions["in"].write(offset, array)  # the client's copy, measured per query
            ref = RegionRef(in_name, size, offset)
            placed[name] = RegionTensor(Datatype.from_numpy(array.dtype), array.shape, ref)
        outputs = [
            RequestedOutput(name, region=RegionRef(out_name, size, offset))
            for name, (offset, size) in out_place.items()
        ]
        return InferenceRequest(
            model, {}, model_version=version, outputs=outputs, in_regions=placed
        )

    @staticmethod
    def _read(slot: _Slot, response: InferenceResponse) -> dict[str, np.ndarray]:
        outputs = dict(response.outputs)
        for name, placed in response.in_regions.items():
            outputs[name] = slot.regions["out"].read(placed.ref.offset, placed)
        return outputs


def _layout(sizes: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """(offset, size) of each tensor in a region, one after another, aligned."""
    place, offset = {}, 0
    for name, size in sizes.items():
        place[name] = (offset, size)
        offset += -(-size // _ALIGN) * _ALIGN
    return place
