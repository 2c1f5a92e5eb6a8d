"""Run the REST benchmarks of BENCHMARKS.md: HTTP stacks, and dlscale against Seldon MLServer.

    python -m benchmarks.run [all|stacks|peers|resnet] [--repeats 3] [--duration 5]

Every server runs in its own process with OMP/OPENBLAS/MKL threads at 1 and is driven by the same
closed-loop client (benchmarks/client.py) from this process. Servers alternate within a run;
the tables give medians over the repetitions. Results also go to bench-results/*.json.
"""

from __future__ import annotations

import argparse
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import uvloop

from benchmarks import models, peers
from benchmarks.client import LoadResult, build_request, closed_loop
from benchmarks.models import IDENTITY, MLP, RESNET50, BenchModel

WORK = Path(".bench")
RESULTS = Path("bench-results")
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
HOST = "127.0.0.1"


@dataclass
class Server:
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **THREAD_ENV, **extra}


def start_dlscale(repo: Path, stack: str = "protocol") -> Server:
    """dlscale's REST server (benchmarks/serve_http.py) with one HTTP stack."""
    port = _free_port() if stack == "granian" else 0
    loop = "asyncio" if stack.endswith("-asyncio") else "uvloop"
    argv = ["--stack", stack.removesuffix("-asyncio"), "--port", str(port), "--loop", loop]
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.serve_http", str(repo), *argv],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("LISTENING"):
        proc.kill()
        raise RuntimeError(f"dlscale ({stack}) did not start: {line!r}")
    return Server(f"dlscale-{stack}", proc, int(line.split()[1]))


def start_mlserver(folder: Path, port: int, model_names: list[str]) -> Server:
    """MLServer serving `folder`; returns once every model answers ready."""
    exe = peers.ensure_mlserver()
    proc = subprocess.Popen(
        [str(exe.resolve()), "start", "."],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(PYTHONPATH=str(folder.resolve())),
        start_new_session=True,
    )
    server = Server("mlserver", proc, port)
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


def load(
    server: Server, model: BenchModel, binary: bool, concurrency: int, duration: float
) -> LoadResult:
    """One closed-loop run against `server`."""
    path = f"/v2/models/{model.name}/infer"
    if binary:
        body, headers = model.binary_body()
        wire = build_request(HOST, server.port, path, body, headers)
    else:
        wire = build_request(HOST, server.port, path, model.json_body())
    result = uvloop.run(
        closed_loop(HOST, server.port, wire, concurrency, duration, warmup_s=min(2.0, duration / 2))
    )
    if result.errors:
        print(f"  {server.name}: {result.errors} errors, first: {result.first_error}", flush=True)
    return result


def _record(rows: list[dict[str, Any]], **fields: Any) -> None:
    rows.append(fields)
    shown = {k: v for k, v in fields.items() if k not in ("latencies",)}
    print("  " + json.dumps(shown), flush=True)


# -- the runs --------------------------------------------------------------------------------------


def run_stacks(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """dlscale's REST routes on each candidate HTTP stack, identity JSON [1,16], c=1 and c=32.

    `protocol` is dlscale's own transport on uvloop; `protocol-asyncio` the same on asyncio's loop.
    """
    stacks = ["protocol", "protocol-asyncio", "uvicorn", "granian"]
    for rep in range(repeats):
        shift = rep % len(stacks)
        for stack in stacks[shift:] + stacks[:shift]:
            server = start_dlscale(repo, stack)
            try:
                for c in (1, 32):
                    r = load(server, IDENTITY, False, c, duration)
                    _record(
                        rows,
                        bench="stacks",
                        server=server.name,
                        model="identity",
                        concurrency=c,
                        rep=rep,
                        **r.summary(),
                    )
            finally:
                server.stop()


def run_peers(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """dlscale against MLServer: identity FP32 [1,16] as JSON at c=1 and c=32, alternating."""
    port = _free_port()
    folder = peers.mlserver_repository(
        WORK / "mlserver-repo", repo, [IDENTITY], port, _free_port(), _free_port()
    )
    starters: dict[str, Callable[[], Server]] = {
        "dlscale": lambda: start_dlscale(repo),
        "mlserver": lambda: start_mlserver(folder, port, [IDENTITY.name]),
    }
    order = list(starters)
    for rep in range(repeats):
        for name in order if rep % 2 == 0 else order[::-1]:
            server = starters[name]()
            try:
                for c in (1, 32):
                    r = load(server, IDENTITY, False, c, duration)
                    _record(
                        rows,
                        bench="peers",
                        server=name,
                        model="identity",
                        concurrency=c,
                        rep=rep,
                        **r.summary(),
                    )
            finally:
                server.stop()


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


def _served_batch(server: Server, model: str) -> float:
    with urllib.request.urlopen(f"http://{HOST}:{server.port}/v2/models/{model}/stats") as r:
        stats = json.load(r)["model_stats"][0]
    return stats["inference_count"] / max(stats["execution_count"], 1)


def run_resnet(repo: Path, repeats: int, duration: float, rows: list[dict[str, Any]]) -> None:
    """resnet50 with binary tensors at c=16 against in-process onnxruntime at batch 16."""
    if not models.build_resnet50(repo):
        print("resnet50 skipped: dlscale's zoo (and torch, which builds it) is not installed")
        return
    models.write_dlscale_config(repo, RESNET50)
    concurrency = RESNET50.max_batch_size
    for rep in range(repeats):
        server = start_dlscale(repo)
        try:
            r = load(server, RESNET50, True, concurrency, duration)
            batch = _served_batch(server, RESNET50.name)
            _record(
                rows,
                bench="resnet",
                server="dlscale",
                model="resnet50",
                concurrency=concurrency,
                rep=rep,
                mean_batch=round(batch, 2),
                **r.summary(),
            )
        finally:
            server.stop()
        ips = inprocess_throughput(RESNET50.path(repo), RESNET50, concurrency, duration)
        _record(
            rows,
            bench="resnet",
            server="onnxruntime-inprocess",
            model="resnet50",
            concurrency=concurrency,
            rep=rep,
            throughput=round(ips, 2),
        )


# -- reporting -------------------------------------------------------------------------------------


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
        for key in ("throughput", "p50_ms", "p99_ms", "mean_batch"):
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


def main(argv: list[str] | None = None) -> int:
    """Entry point of `make bench`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "which", nargs="?", default="all", choices=("all", "stacks", "peers", "resnet")
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    parser.add_argument("--resnet-duration", type=float, default=20.0)
    args = parser.parse_args(argv)
    repo = WORK / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    for model, build in ((IDENTITY, models.build_identity), (MLP, models.build_mlp)):
        build(repo)
        models.write_dlscale_config(repo, model)
    rows: list[dict[str, Any]] = []
    info = machine()
    print(json.dumps(info), flush=True)
    if args.which in ("all", "stacks"):
        run_stacks(repo, args.repeats, args.duration, rows)
    if args.which in ("all", "peers"):
        peers.ensure_mlserver()
        info["mlserver"] = peers.mlserver_version()
        run_peers(repo, args.repeats, args.duration, rows)
    if args.which in ("all", "resnet"):
        run_resnet(repo, args.repeats, args.resnet_duration, rows)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"rest-{args.which}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": info, "args": vars(args), "rows": rows}, indent=1))
    for bench in ("stacks", "peers", "resnet"):
        table = median_table(rows, bench)
        if table:
            print(f"\n## {bench} (medians of {args.repeats})\n\n{markdown(table)}")
    print(f"\nraw results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
