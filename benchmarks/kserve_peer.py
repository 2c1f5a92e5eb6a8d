"""dlscale (two revisions) against KServe's model server: identity FP32 [1,16] as JSON, c=1 and 32.

    python -m benchmarks.kserve_peer [--before REV] [--after HEAD] [--repeats 5] [--duration 4]

Three servers, each in its own process with OMP/OPENBLAS/MKL threads at 1, started once and kept
for every repetition: `dlscale serve` of two revisions (checked out under .bench/revisions, as
benchmarks/large.py does), each with the REST benchmark's `identity` (ONNX Identity, max batch
32, queue delay 500 µs, one onnxruntime thread), and KServe's Python model server
(benchmarks/serve_kserve.py in .bench/kserve-venv: an identity `kserve.Model` in numpy, no
batching). One closed-loop client for all (benchmarks/harness/clients.py), JSON bodies, at 1
and 32 requests in flight; servers alternate within each repetition. The table gives medians;
ratios are medians of the per-repetition ratios (the machine's drift cancels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import models
from benchmarks.harness.clients import LoadResult
from benchmarks.harness.loads import rest_load
from benchmarks.harness.models import IDENTITY
from benchmarks.harness.revisions import checkout, start_revision
from benchmarks.harness.servers import (
    RESULTS,
    WORK,
    ServerProcess,
    free_port,
    model_paths,
    thread_env,
    wait_ready,
)
from benchmarks.harness.statistics import machine, median_of, paired_ratios, record

#: Where KServe is installed (`python -m venv DIR && DIR/bin/pip install kserve`).
KSERVE_VENV = WORK / "kserve-venv"
SERVERS = ("before", "after", "kserve")
CONCURRENCY = (1, 32)


def start_kserve(venv: Path) -> ServerProcess:
    """KServe's model server with the identity model, once it says the model is ready."""
    python = venv / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"no KServe venv at {venv}: python -m venv it, pip install kserve")
    port = free_port()
    script = Path(__file__).with_name("serve_kserve.py")
    argv = [str(python), str(script), IDENTITY.name, str(port), str(free_port())]
    proc = subprocess.Popen(
        argv, env=thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = ServerProcess("kserve", proc, port)
    wait_ready(server, model_paths([IDENTITY.name]), timeout_s=120)
    return server


def run(
    before: str, after: str, repeats: int, duration: float, venv: Path = KSERVE_VENV
) -> list[dict[str, Any]]:
    """Every server at every concurrency, servers alternating within each repetition."""
    repo = WORK / "kserve-peer-repo"
    models.build_identity(repo)
    models.write_dlscale_config(repo, IDENTITY)
    servers: dict[str, ServerProcess] = {}
    rows: list[dict[str, Any]] = []
    try:
        for side, revision in (("before", before), ("after", after)):
            servers[side] = start_revision(checkout(revision), repo)[0]
        servers["kserve"] = start_kserve(venv)
        for rep in range(repeats):
            order = SERVERS if rep % 2 == 0 else SERVERS[::-1]
            for c in CONCURRENCY:
                for side in order:
                    r = _load(servers[side], c, duration)
                    record(rows, server=side, concurrency=c, rep=rep, **r.summary())
            print(f"repetition {rep + 1} done", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return rows


def _load(server: ServerProcess, concurrency: int, duration: float) -> LoadResult:
    """One run; once more if the server closed a connection mid-run (said, not hidden)."""
    try:
        return rest_load(server, IDENTITY, False, concurrency, duration)
    except ConnectionError as exc:
        print(f"  {server.name} at c={concurrency}: {exc}; run again", flush=True)
        return rest_load(server, IDENTITY, False, concurrency, duration)


def markdown(rows: list[dict[str, Any]]) -> str:
    """Medians per server and concurrency, then the paired ratios."""
    lines = ["| server | concurrency | req/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    for c in CONCURRENCY:
        for side in SERVERS:
            cells = [median_of(rows, k, server=side, concurrency=c) for k in
                     ("throughput", "p50_ms", "p99_ms")]  # fmt: skip
            lines.append(f"| {side} | {c} | {cells[0]:,.1f} | {cells[1]:.3f} | {cells[2]:.2f} |")
    lines.append("")
    for c in CONCURRENCY:
        for a, b in (("after", "kserve"), ("before", "kserve"), ("after", "before")):
            ratios = paired_ratios(rows, "throughput", a, b, concurrency=c)
            low, mid, high = min(ratios), statistics.median(ratios), max(ratios)
            lines.append(f"- c={c}: {a}/{b} throughput {mid:.2f}x ({low:.2f} to {high:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="the dlscale revision before the change")
    parser.add_argument("--after", default="HEAD", help="the dlscale revision measured")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds measured per run")
    parser.add_argument("--kserve-venv", type=Path, default=KSERVE_VENV, help="KServe's venv")
    args = parser.parse_args(argv)
    rows = run(args.before, args.after, args.repeats, args.duration, args.kserve_venv)
    text = markdown(rows)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"kserve-peer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    result = {"machine": machine(), "before": args.before, "after": args.after, "rows": rows}
    out.write_text(json.dumps({**result, "table": text}, indent=1))
    print(f"{text}\n\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
