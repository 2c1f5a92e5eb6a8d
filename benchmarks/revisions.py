"""The same REST and gRPC load against `dlscale serve` of two git revisions, alternating.

    python -m benchmarks.revisions BASE [HEAD] [--repeats 5] [--duration 5]

Answers "is this change slower?" in one run: each revision is checked out once into its own
worktree under .bench/revisions/, started as a user starts it (`python -m dlscale serve` with
that tree's src/ on the path), and driven by this checkout's closed-loop clients
(benchmarks/harness/clients.py, benchmarks/harness/grpc_clients.py) on the same machine, with
the revisions
alternating within each repetition so that drift in the machine's speed hits both alike. The
table gives medians and the HEAD/BASE ratio per load; results also go to bench-results/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import uvloop

from benchmarks.harness import models
from benchmarks.harness.clients import LoadResult, build_request, closed_loop
from benchmarks.harness.grpc_clients import grpc_closed_loop, infer_request
from benchmarks.harness.models import IDENTITY, MLP, BenchModel
from benchmarks.harness.revisions import checkout, start_revision
from benchmarks.harness.servers import HOST, RESULTS, WORK
from benchmarks.harness.statistics import machine, median_of, record

#: (label, protocol, model, concurrency, binary): the loads of BENCHMARKS.md's peer tables.
LOADS: list[tuple[str, str, BenchModel, int, bool]] = [
    ("rest-binary identity c=32", "rest", IDENTITY, 32, True),
    ("rest-json identity c=32", "rest", IDENTITY, 32, False),
    ("rest-binary mlp c=32", "rest", MLP, 32, True),
    ("grpc identity c=1", "grpc", IDENTITY, 1, False),
    ("grpc identity c=32", "grpc", IDENTITY, 32, False),
]


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
            server, http, grpc = start_revision(trees[side], repo)
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
        return median_of(rows, key, server=side, load=load)

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
