"""How full the [1,16] batches are, and what a request costs the server, revisions side by side.

    python -m benchmarks.small_batches [--load "grpc [1,16]"] [--concurrency 32] [--repeats 6]
                                       [--duration 4] REVISION [REVISION ...]

Starts `dlscale serve` of each revision (checked out under .bench/revisions, as benchmarks/large.py
does) on large.py's repository and drives one of its loads (benchmarks/harness/loads.py; the
concurrency may be changed: 1 is a lone client), revisions alternating within each repetition.
For each run it reads the model's statistics before and after (`/v2/models/identity16/stats`):
requests per batch (inference count over execution count) and the server's CPU time (every
thread, /proc) per request, beside the requests/s. The table gives the medians and, against the
first revision, the median of the per-repetition ratios. A diagnosis beside large.py's timed
ratios: whether the server batches, not only how fast it answered.
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request
from typing import Any

from benchmarks.harness.loads import LOADS, drive
from benchmarks.harness.models import SMALL, build_large_repository
from benchmarks.harness.revisions import checkout, start_revision
from benchmarks.harness.servers import WORK, ServerProcess, cpu_seconds


def _counts(http: int) -> tuple[int, int]:
    url = f"http://127.0.0.1:{http}/v2/models/{SMALL.name}/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def _run(
    server: ServerProcess, ports: tuple[int, int], load: str, c: int, s: float
) -> dict[str, float]:
    _, protocol, model, rows, _ = next(entry for entry in LOADS if entry[0] == load)
    (done0, batches0), cpu0 = _counts(ports[0]), cpu_seconds(server.proc.pid)
    result = drive(protocol, model, rows, c, ports, s)
    (done1, batches1), cpu1 = _counts(ports[0]), cpu_seconds(server.proc.pid)
    requests = max(1, done1 - done0)
    return {
        "throughput": result.throughput,
        "rows_per_batch": requests / max(1, batches1 - batches0),
        "cpu_us": (cpu1 - cpu0) / requests * 1e6,
    }


def _row(rev: str, mine: list[dict[str, Any]], first: list[dict[str, Any]]) -> str:
    """One revision's medians, and its per-repetition ratios to the first revision's."""

    def median(key: str) -> float:
        return statistics.median(run[key] for run in mine)

    def ratio(key: str) -> float:
        return statistics.median(a[key] / b[key] for a, b in zip(mine, first, strict=True))

    return (
        f"| {rev} | {median('throughput'):,.0f} | {ratio('throughput'):.2f} | "
        f"{median('rows_per_batch'):.2f} | {median('cpu_us'):.0f} | {ratio('cpu_us'):.2f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revisions", nargs="+", help="git revisions; ratios are to the first")
    parser.add_argument("--load", default="grpc [1,16]", help="a label of harness/loads.py")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    args = parser.parse_args(argv)
    repo = build_large_repository(WORK / "large-repo")
    servers = {rev: start_revision(checkout(rev), repo) for rev in args.revisions}
    runs: dict[str, list[dict[str, Any]]] = {rev: [] for rev in args.revisions}
    try:
        for rep in range(args.repeats):
            order = args.revisions if rep % 2 == 0 else args.revisions[::-1]
            for rev in order:
                server, http, grpc = servers[rev]
                run = _run(server, (http, grpc), args.load, args.concurrency, args.duration)
                runs[rev].append(run)
                print(rep + 1, rev, json.dumps({k: round(v, 2) for k, v in run.items()}))
    finally:
        for server, _, _ in servers.values():
            server.stop()
    print(f"\n{args.load} at {args.concurrency} in flight, {args.repeats} repetitions")
    print("| revision | req/s | ratio | requests per batch | server CPU us/req | ratio |")
    print("|---|---|---|---|---|---|")
    for rev, mine in runs.items():
        print(_row(rev, mine, runs[args.revisions[0]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
