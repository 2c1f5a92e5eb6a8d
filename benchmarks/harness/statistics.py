"""What a benchmark reports: rows of runs, their medians, markdown tables, the machine.

Each run is a row (`record`); `median_table` and `markdown` give the medians over repetitions;
`machine` says what the numbers were measured on, and `memcpy_gbps` one core's copy bandwidth,
the ceiling of any server that copies a tensor.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from typing import Any

import numpy as np
import onnxruntime as ort


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


def memcpy_gbps(nbytes: int = 32 * 3 * 224 * 224 * 4, copies: int = 30) -> float:
    """One core's copy bandwidth for `nbytes` (numpy copyto, median of `copies`), in GB/s."""
    src = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(copies):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def _matches(row: dict[str, Any], match: dict[str, Any]) -> bool:
    return all(row.get(k) == v for k, v in match.items())


def median_of(rows: list[dict[str, Any]], key: str, **match: Any) -> float:
    """The median of `key` over the rows whose fields equal `match` (StatisticsError if none)."""
    return float(statistics.median(r[key] for r in rows if _matches(r, match)))


def paired_ratios(
    rows: list[dict[str, Any]], key: str, a: str, b: str, side: str = "server", **match: Any
) -> list[float]:
    """Per repetition (`rep`), `key` of the row whose `side` is `a` over that of `b`'s, among the
    rows matching `match`; repetitions where either is missing, or b's is 0, are left out.

    Two servers measured back to back in one repetition share the machine's drift: the median
    of these ratios cancels it better than the ratio of the medians."""
    by = {(r[side], r["rep"]): r[key] for r in rows if _matches(r, match)}
    return [by[a, rep] / by[b, rep] for (s, rep) in by if s == a and by.get((b, rep))]
