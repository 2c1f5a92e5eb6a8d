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
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import psutil

from dlscale.hardware.nvml import Nvml, NvmlUnavailable

#: The most files of a model folder summed for an estimate (a folder of a million files is not
#: read through at each load).
MAX_FILES = 10_000


def host_bytes(leave_out: Collection[int] = frozenset()) -> int:
    """Resident bytes of this process and its descendants (Python model workers hold models
    too), less the subtrees of the processes in `leave_out`."""
    return sum(_resident(pid) for pid in _tree(leave_out))


def descendants() -> frozenset[int]:
    """The processes this one started, and theirs, now.

    A load's growth counts the processes it starts (its model's worker), not those that ran
    before it: their memory moves with what they serve (REST workers take in request bodies;
    another model's worker answers), and one that ends beside a load hides what it held. A CI
    run read 60 KiB for a load that took 100 MiB in a test process that also held processes
    earlier tests had started (a Ray cluster's); the likely cause, not caught in the act."""
    return frozenset(_tree(frozenset())) - {os.getpid()}


def _tree(leave_out: Collection[int]) -> list[int]:
    """This process and its descendants, not entering the processes in `leave_out`."""
    me = os.getpid()
    # Without /proc/PID/task/TID/children, psutil asks for each process's children (it walks
    # every process of the host, ms each).
    proc = os.path.exists(f"/proc/{me}/task/{me}/children")
    found, todo = [], [me]
    while todo:
        current = todo.pop()
        found.append(current)
        children = _proc_children(current) if proc else _psutil_children(current)
        todo += [c for c in children if c not in leave_out]
    return found


def _proc_children(pid: int) -> list[int]:
    """`pid`'s children, from Linux's per-thread lists of children.

    Plain `os` calls, not pathlib's nor psutil's objects: a load reads the tree twice, and with
    a thread per loaded instance that took 0.6 ms of a worker thread holding the GIL, which the
    event loop waits for (0.3 to 0.4 ms this way, the same bytes)."""
    found: list[int] = []
    tasks = f"/proc/{pid}/task"
    with contextlib.suppress(FileNotFoundError):  # a process that just ended
        for tid in os.listdir(tasks):
            path = f"{tasks}/{tid}/children"
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as children:
                found += [int(c) for c in children.read().split()]  # (a thread that ended)
    return found


def _psutil_children(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):  # a process that just ended has none
        return [c.pid for c in psutil.Process(pid).children()]
    return []


def _resident(pid: int) -> int:
    """Resident bytes of one process from /proc/PID/statm, the file psutil reads (psutil's
    figure without it); 0 for a process that just ended."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except FileNotFoundError:
        if os.path.exists(f"/proc/{os.getpid()}/statm"):
            return 0  # ended
        with contextlib.suppress(psutil.Error):
            return int(psutil.Process(pid).memory_info().rss)
        return 0
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


def read(keys: Iterable[str], leave_out: Collection[int] = frozenset()) -> dict[str, int]:
    """The bytes each device key holds now (host: `cpu`, less the processes in `leave_out`);
    keys it cannot read are left out."""
    sizes = {key: host_bytes(leave_out) if key == "cpu" else device_bytes(key) for key in keys}
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


def trim_and_read(trimming: bool, devices: list[str]) -> tuple[dict[str, int], frozenset[int]]:
    """The devices' bytes now, after handing the memory of evicted models back when
    `trimming`, less the processes running now, and those processes: a load's readings leave
    them out (`descendants`). One trip off the loop for all."""
    if trimming:
        trim()
    running = descendants()
    return read(devices, running), running
