"""CUDA for shared-memory regions, through CuPy (the [gpu] extra), imported only when used.

A CUDA region is a cudaIpcMemHandle that a client process made of its own device memory; it is
opened once here and handed out as CuPy arrays over it. Host memory the server owns (REST
bodies) is page-locked here on a CUDA host, so that host-to-device copies are DMAs from it.
Device arrays from a backend (CuPy, or PyTorch through `__cuda_array_interface__`) are copied
into regions or back to the host by the functions below; nothing else in serving touches CUDA.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.hardware.nvml import Nvml, NvmlUnavailable

#: cudaHostRegisterPortable: the pages count as pinned in every CUDA context of the process.
_HOST_REGISTER_PORTABLE = 1
#: cudaIpcMemLazyEnablePeerAccess, the one flag cudaIpcOpenMemHandle takes.
_IPC_LAZY_PEER_ACCESS = 1
_IPC_HANDLE_BYTES = 64


def _cupy() -> Any:
    import cupy  # the [gpu] extra; absent on CPU-only machines

    return cupy


@functools.cache
def gpu_count() -> int | None:
    """GPUs NVML sees on this host, counted without starting CUDA; None without NVML (a load
    request's check of its devices then leaves it to the runtime to say what it lacks).

    NVML, not CuPy: CUDA enumerates its devices once, when it starts, under the
    CUDA_VISIBLE_DEVICES of that moment, and the server asks this before its models load; a
    model placed on a MIG instance sets that variable first (backends/torch/device.py).
    """
    try:
        nvml = Nvml.open()
    except NvmlUnavailable:
        return None
    try:
        count = nvml.ask("nvmlDeviceGetCount")
        return int(count.value) if count.ok else None
    finally:
        nvml.close()


@functools.cache
def device_count() -> int:
    """NVIDIA GPUs here when CuPy is installed (0 otherwise): what CUDA regions can use."""
    if importlib.util.find_spec("cupy") is None:
        return 0
    return gpu_count() or 0


def _cuda_count() -> int:
    """CUDA devices this process uses (CUDA starts here: only when a region is opened)."""
    try:
        return int(_cupy().cuda.runtime.getDeviceCount())
    except Exception:  # CuPy present without a driver or a device
        return 0


def _require(device_id: int) -> Any:
    count = _cuda_count() if device_count() else 0
    if count == 0:
        raise InvalidInput(
            "CUDA shared memory needs a CUDA device and CuPy (pip install 'dlscale[gpu]'); this "
            "server has no CUDA device it can use"
        )
    if not 0 <= device_id < count:
        raise InvalidInput(f"device_id {device_id}: this server has CUDA devices 0..{count - 1}")
    return _cupy()


class DeviceRegion:
    """A CUDA region: the client's device memory, opened from its IPC handle once."""

    def __init__(self, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if len(raw_handle) != _IPC_HANDLE_BYTES:
            raise InvalidInput(
                f"raw_handle holds {len(raw_handle)} bytes; a cudaIpcMemHandle_t has "
                f"{_IPC_HANDLE_BYTES}"
            )
        cp = _require(device_id)
        self.device_id = device_id
        self.byte_size = byte_size
        try:
            with cp.cuda.Device(device_id):
                self._ptr = int(cp.cuda.runtime.ipcOpenMemHandle(raw_handle, _IPC_LAZY_PEER_ACCESS))
        except cp.cuda.runtime.CUDARuntimeError as exc:
            # Also what a handle made by this very process gets: CUDA cannot open its own.
            raise InvalidInput(
                f"the CUDA IPC handle cannot be opened on device {device_id}: {exc}"
            ) from None
        self._memory = cp.cuda.UnownedMemory(self._ptr, byte_size, self, device_id)

    def array(self, offset: int, size: int) -> Any:
        """`size` bytes from `offset` as a CuPy uint8 array over the region (no copy)."""
        cp = _cupy()
        pointer = cp.cuda.MemoryPointer(self._memory, offset)
        return cp.ndarray((size,), dtype=cp.uint8, memptr=pointer)

    def close(self) -> bool:
        """Close the IPC mapping (the client's memory stays the client's)."""
        cp = _cupy()
        with cp.cuda.Device(self.device_id):
            cp.cuda.runtime.ipcCloseMemHandle(self._ptr)
        return True


def page_lock(address: int, size: int) -> None:
    """Register host memory with the CUDA driver as page-locked (cudaHostRegister)."""
    _cupy().cuda.runtime.hostRegister(address, size, _HOST_REGISTER_PORTABLE)


def page_unlock(address: int) -> None:
    """Undo `page_lock` (before the memory is unmapped)."""
    _cupy().cuda.runtime.hostUnregister(address)


def is_device_array(array: object) -> bool:
    """Whether an array lives in device memory (CuPy, or PyTorch CUDA tensors)."""
    return not isinstance(array, np.ndarray) and hasattr(array, "__cuda_array_interface__")


def as_cupy(array: Any) -> Any:
    """A device array as a CuPy array over the same memory (PyTorch tensors included).

    CuPy has no bfloat16: a BF16 tensor comes as int16 over the same bytes (to_host views it
    back), not as the void dtype its array interface would give, which no datatype maps.
    """
    if str(getattr(array, "dtype", "")) == "torch.bfloat16":
        import torch  # the tensor is torch's, so torch is here

        return _cupy().asarray(array.view(torch.int16))  # "<i2" in every torch release
    return _cupy().asarray(array)


def dtype_of(array: Any) -> np.dtype[Any]:
    """numpy's dtype of a host or device array (CuPy, PyTorch; BF16 as ml_dtypes.bfloat16)."""
    if not is_device_array(array):
        return np.asarray(array).dtype
    if str(getattr(array, "dtype", "")) == "torch.bfloat16":
        import ml_dtypes

        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    found: np.dtype[Any] = np.dtype(as_cupy(array).dtype)
    return found


def to_host(array: Any) -> np.ndarray:
    """A host copy of a device array (BF16 as ml_dtypes.bfloat16); host arrays as they are."""
    if not is_device_array(array):
        return np.asarray(array)
    cp = _cupy()
    host = np.asarray(cp.asnumpy(as_cupy(array)))
    if str(getattr(array, "dtype", "")) == "torch.bfloat16":
        import ml_dtypes

        host = host.view(ml_dtypes.bfloat16)
    return host


def write_device(target: Any, array: Any) -> None:
    """Copy an array (host or device) into a CuPy uint8 array of exactly its byte size.

    Returns once the bytes are in place: the client reads them as soon as it has the answer.
    """
    cp = _cupy()
    with cp.cuda.Device(target.device.id):
        if is_device_array(array):
            source = cp.ascontiguousarray(as_cupy(array)).reshape(-1).view(cp.uint8)
            target[...] = source
        else:
            target.set(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        cp.cuda.get_current_stream().synchronize()
