"""All-reduce benchmark on torch.distributed (gloo on CPUs, NCCL on GPUs), beside the cost model.

N processes each all-reduce float32 buffers of each size: warm-up calls, then timed calls each
started together after a barrier; a call's time is the slowest rank's, the reported time their
median. The reduced values are checked before and after the timed calls. torch is imported in
the worker processes and in `run` only: it is an optional extra.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import PlanError
from dlscale.plan.collective import Estimate, Fabric, Topology, allreduce, bus_bandwidth, loopback

_PATTERN = 7  # element i holds (rank + 1) * (i % 7 + 1): a misplaced chunk changes the sum


@dataclass(frozen=True)
class BenchRow:
    """One message size: measured median time and bandwidths, and the model's prediction."""

    nbytes: int
    seconds: float
    algbw: float
    busbw: float
    predicted_s: float
    predicted_busbw: float
    predicted_algorithm: str


@dataclass(frozen=True)
class BenchReport:
    """A whole run: setup, the fabric the model assumed, one row per size, and the value check."""

    backend: str
    nproc: int
    iters: int
    fabric: str
    fabric_note: str
    rows: list[BenchRow]
    values_checked: int


def measure_loopback(nbytes: int = 32 << 20, pings: int = 200) -> Fabric:
    """TCP over 127.0.0.1, as gloo uses it: one-way bandwidth and one-way small-message latency."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    chunk = 1 << 20

    def echo_then_sink() -> None:
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(pings):
                conn.sendall(conn.recv(1))
            buf = bytearray(chunk)
            got = 0
            while got < nbytes:
                got += conn.recv_into(buf)
            conn.sendall(b"k")

    peer = threading.Thread(target=echo_then_sink, daemon=True)
    peer.start()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        for _ in range(pings):
            sock.sendall(b"p")
            sock.recv(1)
        one_way = (time.perf_counter() - t0) / pings / 2
        payload = bytes(chunk)
        t0 = time.perf_counter()
        for _ in range(nbytes // chunk):
            sock.sendall(payload)
        sock.recv(1)
        bandwidth = nbytes // chunk * chunk / (time.perf_counter() - t0)
    peer.join()
    server.close()
    return loopback(bandwidth, one_way)


def _worker(
    rank: int, nproc: int, backend: str, sizes: Sequence[int], iters: int, warmup: int, store: str
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=nproc)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def check(n: int) -> int:
        idx = torch.arange(n, device=device) % _PATTERN + 1
        x = (idx * (rank + 1)).to(torch.float32)
        dist.all_reduce(x)
        want = (idx * (nproc * (nproc + 1) // 2)).to(torch.float32)
        if not torch.equal(x, want):
            bad = int((x != want).nonzero()[0])
            raise PlanError(f"rank {rank}: all-reduce of {4 * n} B wrong at element {bad}")
        return n

    results: list[dict[str, Any]] = []
    checked = 0
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        checked += check(n)
        x = torch.zeros(n, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(x)
        times = torch.zeros(iters, dtype=torch.float64)
        for i in range(iters):
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            sync()
            times[i] = time.perf_counter() - t0
        slowest = times.to(device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        checked += check(n)
        results.append({"nbytes": 4 * n, "times": slowest.cpu().tolist()})
    if rank == 0:
        Path(store + ".result").write_text(json.dumps({"rows": results, "checked": checked}))
    dist.destroy_process_group()


def run(
    nproc: int,
    backend: str = "gloo",
    sizes: Sequence[int] = (1 << 10, 1 << 20),
    iters: int = 20,
    warmup: int = 5,
    fabric: Fabric | None = None,
) -> BenchReport:
    """Time all-reduce over `nproc` local processes and set the cost model's prediction beside it.

    `fabric` is what the model assumes: for gloo by default TCP loopback measured here; for NCCL
    the fabric joining the GPUs (e.g. collective.fabric("nvlink4")), which the caller must give.
    """
    if nproc < 2 or iters < 1 or warmup < 0:
        raise PlanError("an all-reduce benchmark needs --nproc >= 2 and --iters >= 1")
    if backend not in ("gloo", "nccl"):
        raise PlanError(f"backend must be gloo or nccl, got {backend!r}")
    try:
        import torch
        from torch.multiprocessing.spawn import (
            ProcessExitedException,
            ProcessRaisedException,
            start_processes,
        )
    except ImportError:
        raise PlanError(
            "the all-reduce benchmark needs torch: pip install 'dlscale[torch]'"
        ) from None
    if backend == "nccl":
        if fabric is None:
            raise PlanError("with NCCL, name the fabric joining the GPUs (e.g. --fabric nvlink4)")
        if torch.cuda.device_count() < nproc:
            raise PlanError(f"NCCL needs {nproc} GPUs here, found {torch.cuda.device_count()}")
    assumed = fabric or measure_loopback()
    with tempfile.TemporaryDirectory(prefix="dlscale-allreduce-") as tmp:
        store = os.path.join(tmp, "store")
        try:
            start_processes(  # type: ignore[no-untyped-call]
                _worker,
                args=(nproc, backend, list(sizes), iters, warmup, store),
                nprocs=nproc,
                join=True,
                # fork reuses the imported torch (seconds saved per rank); CUDA needs spawn
                start_method="spawn" if backend == "nccl" else "fork",
            )
        except (ProcessRaisedException, ProcessExitedException) as exc:
            last = str(exc).strip().splitlines()[-1]
            raise PlanError(f"all-reduce benchmark failed: {last}") from None
        raw = json.loads(Path(store + ".result").read_text())
    topology = Topology(gpus_per_node=nproc, nodes=1, intra=assumed)
    rows = [bench_row(r["nbytes"], r["times"], topology) for r in raw["rows"]]
    return BenchReport(
        backend, nproc, iters, assumed.name, _fabric_note(assumed), rows, raw["checked"]
    )


def bench_row(nbytes: int, times: list[float], topology: Topology) -> BenchRow:
    """One size's measured times as a row, the cost model's prediction beside them."""
    median = statistics.median(times)
    model: Estimate = allreduce(nbytes, topology)
    algbw = nbytes / median
    return BenchRow(
        nbytes,
        median,
        algbw,
        bus_bandwidth(algbw, topology.ranks),
        model.seconds,
        model.busbw,
        f"{model.algorithm}/{model.protocol}",
    )


def _fabric_note(f: Fabric) -> str:
    if f.step_latency_s is not None:
        return (
            f"TCP loopback measured here: {f.bandwidth / 1e9:.2f} GB/s one way, "
            f"{f.step_latency_s * 1e6:.1f} us one-way latency per step; ring all-reduce assumed"
        )
    return f"{f.name}: {f.bandwidth / 1e9:.1f} GB/s per GPU ({f.note})"
