"""What a load adds to host and device memory: RSS growth on the host, NVML's count on GPUs.

The figures are differences taken around one load while no other load runs on the same devices
(a load whose growth is read runs alone on its devices: serving/memory/turns.py), so that
each is the model's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from dlscale.hardware.nvml import Nvml, NvmlUnavailable

#: The most files of a model folder summed for an estimate (a folder of a million files is not
#: read through at each load).
MAX_FILES = 10_000


def host_bytes() -> int:
    """Resident bytes of this process and its children (Python model workers hold models too)."""
    tree = _descendants(os.getpid())
    if tree is not None:
        return sum(_resident(pid) for pid in tree)
    # No /proc/PID/task/TID/children: psutil walks every process (ms each).
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a worker that just ended holds nothing
            total += int(proc.memory_info().rss)
    return total


def _descendants(pid: int) -> list[int] | None:
    """`pid` and its descendants, from Linux's per-thread lists of children; None without.

    Plain `os` calls, not pathlib's nor psutil's objects: a load reads the tree twice, and with
    a thread per loaded instance that took 0.6 ms of a worker thread holding the GIL, which the
    event loop waits for (0.3 to 0.4 ms this way, the same bytes)."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        tasks = f"/proc/{current}/task"
        with contextlib.suppress(FileNotFoundError):  # a process that just ended
            for tid in os.listdir(tasks):
                path = f"{tasks}/{tid}/children"
                with contextlib.suppress(FileNotFoundError), open(path, "rb") as children:
                    todo += [int(c) for c in children.read().split()]  # (a thread that ended)
    return found


def _resident(pid: int) -> int:
    """Resident bytes of one process from /proc/PID/statm, the file psutil reads; 0 for a
    process that just ended."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * _page_bytes()


@functools.cache
def _page_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE")


@functools.cache
def _nvml() -> Nvml | None:
    try:
        return Nvml.open()
    except NvmlUnavailable:
        return None


def device_bytes(key: str) -> int | None:
    """Bytes in use on GPU `gpuN` as NVML counts them (every allocator: ONNX Runtime's arena,
    PyTorch's caching allocator, CUDA contexts); None without NVML or for another key."""
    if not key.startswith("gpu") or not key[3:].isdigit():
        return None
    nvml = _nvml()
    if nvml is None:
        return None
    handle = _handle(nvml, int(key[3:]))
    info = nvml.value("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
    return int(info.used) if info is not None else None


def _handle(nvml: Nvml, index: int) -> Any:
    """NVML's handle of the process's CUDA device `index`: CUDA numbers the devices that
    CUDA_VISIBLE_DEVICES lists (indices or UUIDs), NVML every device of the host."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    if not visible:
        return nvml.value("nvmlDeviceGetHandleByIndex", index)
    if index >= len(visible):
        return None
    named = visible[index]
    if named.isdigit():
        return nvml.value("nvmlDeviceGetHandleByIndex", int(named))
    return nvml.value("nvmlDeviceGetHandleByUUID", named)


def read(keys: Iterable[str]) -> dict[str, int]:
    """The bytes each device key holds now (host: `cpu`); keys it cannot read are left out."""
    sizes = {key: host_bytes() if key == "cpu" else device_bytes(key) for key in keys}
    return {key: size for key, size in sizes.items() if size is not None}


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def trim() -> None:
    """Hand the memory an unload freed back to the system (glibc's malloc_trim), so that the
    process's RSS follows the budget: without it, 180 loads of 3 MiB MLPs under a 40 MiB budget
    left the RSS at 208 MiB, with it at 129 MiB. A no-op where the C library has no such call."""
    libc = _libc()
    release = getattr(libc, "malloc_trim", None) if libc is not None else None
    if release is not None:
        release(0)


def folder_bytes(folder: Path) -> int:
    """Bytes of the files in a model's version folder (the least a loaded copy holds)."""
    total = 0
    for count, path in enumerate(folder.rglob("*")):
        if count >= MAX_FILES:
            break
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total


def trim_and_read(trimming: bool, devices: list[str]) -> dict[str, int]:
    """The devices' bytes now, after handing the memory of evicted models back when
    `trimming` (one trip off the loop for both)."""
    if trimming:
        trim()
    return read(devices)
