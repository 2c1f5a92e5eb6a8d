"""The same REST and gRPC load against `dlscale serve` of two git revisions, alternating.

    python -m benchmarks.revisions BASE [HEAD] [--repeats 5] [--duration 5]

Answers "is this change slower?" in one run: each revision is checked out once into its own
worktree under .bench/revisions/, started as a user starts it (`python -m dlscale serve` with
that tree's src/ on the path), and driven by this checkout's closed-loop clients
(benchmarks/client.py, benchmarks/grpc_client.py) on the same machine, with the revisions
alternating within each repetition so that drift in the machine's speed hits both alike. The
table gives medians and the HEAD/BASE ratio per load; results also go to bench-results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import uvloop

from benchmarks import models
from benchmarks.client import LoadResult, build_request, closed_loop
from benchmarks.grpc_client import grpc_closed_loop, infer_request
from benchmarks.harness import (
    HOST,
    RESULTS,
    WORK,
    ServerProcess,
    free_port,
    machine,
    record,
    thread_env,
)
from benchmarks.models import IDENTITY, MLP, BenchModel

TREES = WORK / "revisions"
#: (label, protocol, model, concurrency, binary): the loads of BENCHMARKS.md's peer tables.
LOADS: list[tuple[str, str, BenchModel, int, bool]] = [
    ("rest-binary identity c=32", "rest", IDENTITY, 32, True),
    ("rest-json identity c=32", "rest", IDENTITY, 32, False),
    ("rest-binary mlp c=32", "rest", MLP, 32, True),
    ("grpc identity c=1", "grpc", IDENTITY, 1, False),
    ("grpc identity c=32", "grpc", IDENTITY, 32, False),
]


def checkout(revision: str) -> Path:
    """A worktree of `revision` under .bench/revisions (made once, reused)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short=12", f"{revision}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = TREES / sha
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], check=True)
    return tree


def start(tree: Path, repo: Path) -> tuple[ServerProcess, int, int]:
    """`dlscale serve` from `tree`; returns once its models are ready."""
    http, grpc = free_port(), free_port()
    argv = [sys.executable, "-m", "dlscale", "serve", str(repo.resolve())]
    argv += ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", "-1"]
    env = thread_env(PYTHONPATH=str((tree / "src").resolve()))
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    server = ServerProcess(tree.name, proc, http)
    deadline = time.monotonic() + 120
    while not _ready(http):
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"dlscale from {tree} did not become ready")
        time.sleep(0.2)
    return server, http, grpc


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/v2/health/ready", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def drive(
    protocol: str, model: BenchModel, c: int, binary: bool, ports: tuple[int, int], duration: float
) -> LoadResult:
    """One closed-loop run of a load against a started server."""
    http, grpc = ports
    warmup = min(2.0, duration / 2)
    if protocol == "grpc":
        request, _ = infer_request(model)
        result, _ = asyncio.run(grpc_closed_loop(f"{HOST}:{grpc}", request, c, duration, warmup))
        return result
    path = f"/v2/models/{model.name}/infer"
    body, headers = model.binary_body() if binary else (model.json_body(), None)
    wire = build_request(HOST, http, path, body, headers)
    return uvloop.run(closed_loop(HOST, http, wire, c, duration, warmup))


def compare(base: str, head: str, repeats: int, duration: float) -> list[dict[str, Any]]:
    """Every load against both revisions, alternating their order each repetition."""
    repo = WORK / "revisions-repo"
    for build in (models.build_identity, models.build_mlp):
        build(repo)
    for model in (IDENTITY, MLP):
        models.write_dlscale_config(repo, model)
    trees = {"base": checkout(base), "head": checkout(head)}
    rows: list[dict[str, Any]] = []
    order = list(trees)
    for rep in range(repeats):
        for side in order if rep % 2 == 0 else order[::-1]:
            server, http, grpc = start(trees[side], repo)
            try:
                for label, protocol, model, c, binary in LOADS:
                    r = drive(protocol, model, c, binary, (http, grpc), duration)
                    record(rows, bench="revisions", server=side, load=label, rep=rep, **r.summary())
            finally:
                server.stop()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """Median throughput and p99 per load and side, and the head/base ratios."""

    def med(side: str, load: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["server"] == side and r["load"] == load)

    lines = [
        "| load | base req/s | head req/s | head/base | base p99 ms | head p99 ms | p99 ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, *_ in LOADS:
        b, h = med("base", label, "throughput"), med("head", label, "throughput")
        bp, hp = med("base", label, "p99_ms"), med("head", label, "p99_ms")
        lines.append(
            f"| {label} | {b:,.0f} | {h:,.0f} | {h / b:.2f} | {bp:.2f} | {hp:.2f} | {hp / bp:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the revision to compare against (e.g. a commit or main~5)")
    parser.add_argument("head", nargs="?", default="HEAD", help="the revision measured (HEAD)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per run")
    args = parser.parse_args(argv)
    rows = compare(args.base, args.head, args.repeats, args.duration)
    text = table(rows)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"revisions-{time.strftime('%Y%m%d-%H%M%S')}.json"
    meta = {"base": args.base, "head": args.head, "machine": machine()}
    out.write_text(json.dumps({**meta, "rows": rows, "table": text}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
