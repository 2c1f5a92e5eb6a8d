"""A concurrency sweep: closed-loop Offline runs at each concurrency, a throughput-latency curve.

perf_analyzer's `--concurrency-range` measures a server at a series of requests in flight; here
each point is a LoadGen Offline run whose requests are kept `concurrency` in flight, and its
latency is each request's time from sending to answer (an Offline sample's LoadGen latency runs
from the one query's issue and says nothing at one concurrency).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlscale.bench.render import fmt_ms, fmt_rate, percentile_lines, pyplot, save
from dlscale.errors import BenchError


def parse_concurrency(text: str | None) -> tuple[int | None, tuple[int, ...]]:
    """`N` (one run at N in flight) or a sweep: `A:B` doubling from A to B, `A:B:S` in steps S."""
    if text is None:
        return None, ()
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise BenchError(
            f"--concurrency {text!r}: expected N, START:END (doubling) or START:END:STEP"
        ) from None
    if len(numbers) == 1:
        return numbers[0], ()
    if len(numbers) > 3 or any(n < 1 for n in numbers) or numbers[1] < numbers[0]:
        raise BenchError(
            f"--concurrency {text!r}: expected 1 <= START <= END (and STEP >= 1), "
            "as in 1:64 or 4:32:4"
        )
    start, end = numbers[0], numbers[1]
    if len(numbers) == 3:
        points = list(range(start, end + 1, numbers[2]))
    else:
        points = []
        value = start
        while value < end:
            points.append(value)
            value *= 2
    if not points or points[-1] != end:
        points.append(end)
    return None, tuple(points)


def sweep_rows(points: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The concurrency points among a report's sweep points, by concurrency."""
    rows = [p for p in points if p.get("sweep") == "concurrency"]
    return sorted(rows, key=lambda p: (p["target"], p["concurrency"]))


def markdown(points: Sequence[dict[str, Any]]) -> list[str]:
    """The Markdown table of a concurrency sweep (nothing when the run had none)."""
    rows = sweep_rows(points)
    if not rows:
        return []
    lines = [
        "",
        "## Concurrency sweep",
        "",
        "Offline, closed loop: requests kept in flight; latency from sending a request to its "
        "answer.",
        "",
        "| target | concurrency | samples/s | request p50 ms | request p99 ms | verdict "
        "| client-bound |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for p in rows:
        lat = p["request_latency_s"]
        lines.append(
            f"| {p['target']} | {p['concurrency']} | {fmt_rate(p['throughput_samples_per_s'])} "
            f"| {fmt_ms(lat.get('p50'))} | {fmt_ms(lat.get('p99'))} "
            f"| {'VALID' if p['valid'] else 'INVALID'} | {_yes(p.get('client_bound'))} |"
        )
    return lines


def plot(points: Sequence[dict[str, Any]], ceiling: float | None, path: Path) -> Path | None:
    """Throughput against request latency (p50 and p99), each point labelled by concurrency."""
    rows = [
        p for p in sweep_rows(points) if p["throughput_samples_per_s"] and p["request_latency_s"]
    ]
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for target in dict.fromkeys(p["target"] for p in rows):
        mine = [p for p in rows if p["target"] == target]
        x = [p["throughput_samples_per_s"] for p in mine]
        labels = [str(p["concurrency"]) for p in mine]
        percentile_lines(ax, target, x, [p["request_latency_s"] for p in mine], labels)
    if ceiling:
        ax.axvline(ceiling, linestyle=":", color="grey", label=f"client ceiling {ceiling:,.0f}/s")
    ax.set_xlabel("throughput (samples/s)")
    ax.set_ylabel("request latency (ms)")
    ax.set_yscale("log")
    ax.set_title("throughput against latency, by concurrency (labels: requests in flight)")
    ax.legend()
    return save(fig, path)


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")
