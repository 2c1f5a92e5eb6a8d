"""Many small models under a memory budget that fits ten (issue 36, BENCHMARKS.md).

    python -m benchmarks.multimodel --copies 100 --rate 30 --duration 60s

Builds the harness's 256-1024-10 MLP (benchmarks/harness/models.py) and serves it under
`--copies` names. The budget that fits ten is measured, not guessed: a probe server loading on
demand without a budget is asked for eleven of the copies, and the budget is the first one's
measured figure (it carries ONNX Runtime's one-time set-up) plus nine times the median of the
others (docs/memory.md, "What is measured"). Then `dlscale bench multimodel` runs the Zipf mix
against a server holding every copy and against one under that budget, and prints its summary.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import httpx

from benchmarks.harness.models import mlp_copies
from dlscale.bench.multimodel_run import RepoServer
from dlscale.cli import main


def probe_budget(repo: Path, names: list[str], log: Path) -> int:
    """The bytes ten copies hold, from the sizes a probe server measured for eleven."""
    with RepoServer(repo, ["--model-control", "on-demand"], log) as server:
        body = {"inputs": [{"name": "input", "shape": [1, 256], "datatype": "FP32",
                            "data": [0.0] * 256}]}  # fmt: skip
        for name in names[:11]:
            httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=120)
        rows = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=60).json()
    sizes = {r["name"]: r["memory"]["cpu"] for r in rows if "memory" in r}
    first, rest = sizes[names[0]], [sizes[n] for n in names[1:11]]
    print(f"probe: first copy {first / 2**20:.1f} MiB, others median "
          f"{statistics.median(rest) / 2**20:.1f} MiB")  # fmt: skip
    return int(first + 9 * statistics.median(rest))


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=100)
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--duration", default="60s")
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--out", type=Path, default=Path("bench-results/multimodel"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        repo, names = mlp_copies(Path(scratch), args.copies)
        budget = probe_budget(repo, names, args.out / "probe.log")
        print(f"budget: cpu={budget} bytes ({budget / 2**20:.1f} MiB)")
        return main([
            "bench", "multimodel", "--repo", str(repo), "--memory-budget", f"cpu={budget}",
            "--zipf", str(args.zipf), "--rate", str(args.rate), "--duration", args.duration,
            "--out", str(args.out),
        ])  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(run())
