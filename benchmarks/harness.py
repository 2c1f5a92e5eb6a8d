"""What every benchmark script shares: server processes, ports, results, tables, the machine.

A server process prints `LISTENING <port>` once it serves (`announce`); `start_listening` starts
one and reads that line. Peers (MLServer) are started with `start_mlserver`. Each run is a row
(`record`); `median_table` and `markdown` give the medians over repetitions.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import psutil

from benchmarks import peers
from benchmarks.models import BenchModel

WORK = Path(".bench")
RESULTS = Path("bench-results")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
HOST = "127.0.0.1"


@dataclass
class ServerProcess:
    """A server process started for one round, and the port it listens on."""

    name: str
    proc: subprocess.Popen[str]
    port: int

    def stop(self) -> None:
        """SIGTERM, then SIGKILL to its process group if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time so far of a process and its descendants (a peer's tritonserver
    runs under the Python process that started it); gone children no longer count."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


def free_port() -> int:
    """A loopback port free now (for servers that cannot be asked for port 0)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def thread_env(**extra: str) -> dict[str, str]:
    """This process's environment with one math-library thread per process, plus `extra`."""
    return {**os.environ, **THREAD_ENV, **extra}


def announce(port: int) -> None:
    """What a server process prints once it serves: the line start_listening waits for."""
    print(f"LISTENING {port}", flush=True)


def start_listening(name: str, argv: list[str]) -> ServerProcess:
    """A Python server process that announces its port; killed if it does not."""
    proc = subprocess.Popen(
        [sys.executable, *argv],
        stdout=subprocess.PIPE,
        text=True,
        env=thread_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("LISTENING"):
        proc.kill()
        raise RuntimeError(f"{name} did not start: {line!r}")
    return ServerProcess(name, proc, int(line.split()[1]))


def start_mlserver(folder: Path, port: int, model_names: list[str]) -> ServerProcess:
    """MLServer serving `folder` (peers.mlserver_repository); returns once every model is ready."""
    exe = peers.ensure_mlserver()
    proc = subprocess.Popen(
        [str(exe.resolve()), "start", "."],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=thread_env(PYTHONPATH=str(folder.resolve())),
        start_new_session=True,
    )
    server = ServerProcess("mlserver", proc, port)
    deadline = time.monotonic() + 180
    pending = [f"/v2/models/{m}/ready" for m in model_names]
    while pending:
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("MLServer did not become ready (run it by hand to see why)")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}{pending[0]}", timeout=2) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(0.5)
    return server


def inprocess_throughput(path: Path, model: BenchModel, batch: int, duration: float) -> float:
    """Rows per second of a bare onnxruntime session at `batch`, same session options as served."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = model.intra_op_threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = model.rows(batch)
    session.run(None, {model.input_name: x})
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        session.run(None, {model.input_name: x})
        runs += 1
    return runs * batch / (time.perf_counter() - start)


# -- results -------------------------------------------------------------------------------------


def record(rows: list[dict[str, Any]], **fields: Any) -> None:
    """Keep one run's row and print it (without its raw latencies)."""
    rows.append(fields)
    shown = {k: v for k, v in fields.items() if k not in ("latencies",)}
    print("  " + json.dumps(shown), flush=True)


def median_table(rows: list[dict[str, Any]], bench: str) -> list[dict[str, Any]]:
    """Median throughput and latency per (server, model, concurrency)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row["bench"] == bench:
            groups.setdefault((row["server"], row["model"], row["concurrency"]), []).append(row)
    table = []
    for (server, model, c), runs in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])
    ):
        entry: dict[str, Any] = {
            "server": server,
            "model": model,
            "concurrency": c,
            "runs": len(runs),
        }
        for key in ("throughput", "p50_ms", "p99_ms", "mean_batch", "batch"):
            values = [r[key] for r in runs if key in r]
            if values:
                entry[key] = round(statistics.median(values), 3 if key.endswith("ms") else 1)
        table.append(entry)
    return table


def markdown(table: list[dict[str, Any]]) -> str:
    """A markdown table of the medians."""
    cols = [
        "server",
        "model",
        "concurrency",
        "runs",
        "throughput",
        "p50_ms",
        "p99_ms",
        "mean_batch",
        "batch",
    ]
    cols = [c for c in cols if any(c in row for row in table)]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in cols) + " |" for row in table]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
    }
