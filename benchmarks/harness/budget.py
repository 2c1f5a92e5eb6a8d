"""The memory budget that fits N copies of a model, measured by a probe server, not guessed.

A `dlscale serve --model-control on-demand` without a budget is asked for N + 1 copies; the
budget is the first one's measured figure (it carries ONNX Runtime's one-time set-up) plus
N - 1 times the median of the others (docs/memory.md, "What is measured"): the rule of
benchmarks/multimodel.py, for any N.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import httpx

from dlscale.bench.multimodel_run import RepoServer


def budget_for(repo: Path, names: list[str], body: bytes, count: int, log: Path) -> int:
    """The bytes `count` of the copies `names` hold, from the sizes a probe server measured."""
    with RepoServer(repo, ["--model-control", "on-demand"], log) as server:
        headers = {"Content-Type": "application/json"}
        for name in names[: count + 1]:
            url = f"{server.url}/v2/models/{name}/infer"
            httpx.post(url, content=body, headers=headers, timeout=120).raise_for_status()
        rows = httpx.post(f"{server.url}/v2/repository/index", json={}, timeout=60).json()
    sizes = {r["name"]: r["memory"]["cpu"] for r in rows if "memory" in r}
    first, rest = sizes[names[0]], [sizes[n] for n in names[1 : count + 1]]
    print(f"probe: first copy {first / 2**20:.1f} MiB, others median "
          f"{statistics.median(rest) / 2**20:.1f} MiB")  # fmt: skip
    return int(first + (count - 1) * statistics.median(rest))
