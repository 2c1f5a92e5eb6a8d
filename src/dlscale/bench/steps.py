"""Where a pipeline's time goes: each step's queue and compute per request, and the limiting step.

The statistics extension (Triton's, which dlscale serves too, over REST and gRPC) is read for the
pipeline and for each of its step models before and after the runs; the differences give, per
step, the mean time a request waited in the step's queue and spent in its batch, the mean batch,
and how busy the step's instances were. The step whose instances were busiest (the least spare
capacity) is the one that limits the pipeline. Statistics count every client's requests: the
figures are the run's alone when nothing else used those models meanwhile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any, Protocol

from rich.table import Table

from dlscale.bench.render import fmt, markdown_table, rich_table


class StatsSource(Protocol):
    """What the breakdown reads: a model's config and statistics documents (REST form)."""

    async def model_config(self, model: str) -> dict[str, Any] | None: ...

    async def statistics(self, model: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Counters:
    """A model's cumulative counters, as the statistics extension reports them."""

    requests: int = 0  # successful requests
    request_ns: int = 0  # their time in the server
    queue_ns: int = 0  # summed over requests
    compute_ns: int = 0  # summed over requests (each request counts its batch's time)
    rows: int = 0  # inference_count
    batches: int = 0  # execution_count
    busy_ns: int = 0  # summed over batches: the instances' busy time

    @classmethod
    def of(cls, document: dict[str, Any] | None) -> Counters | None:
        """The first model_stats entry of a statistics document; None when there is none."""
        entries = (document or {}).get("model_stats") or []
        if not entries:
            return None
        entry = entries[0]
        stats = entry.get("inference_stats", {})

        def ns(key: str, source: dict[str, Any] = stats) -> int:
            return int(source.get(key, {}).get("ns", 0))

        compute = ("compute_input", "compute_infer", "compute_output")
        busy = sum(ns(k, row) for row in entry.get("batch_stats", []) for k in compute)
        return cls(
            requests=int(stats.get("success", {}).get("count", 0)),
            request_ns=ns("success"),
            queue_ns=ns("queue"),
            compute_ns=sum(ns(k) for k in compute),
            rows=int(entry.get("inference_count", 0)),
            batches=int(entry.get("execution_count", 0)),
            busy_ns=busy,
        )

    def minus(self, before: Counters | None) -> Counters:
        """What was counted since `before`."""
        if before is None:
            return self
        return Counters(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))


@dataclass(frozen=True)
class Step:
    """One step of the pipeline: its position, model and instance count."""

    index: int
    model: str
    instances: int


@dataclass(frozen=True)
class Snapshot:
    """The counters of the pipeline and of each step at one moment."""

    pipeline: Counters | None
    steps: tuple[Counters | None, ...]
    at_ns: int


async def pipeline_steps(source: StatsSource, model: str) -> list[Step]:
    """The steps of `model` from its config (Triton's ensemble_scheduling); [] when it has none."""
    config = await source.model_config(model) or {}
    out = []
    scheduling = config.get("ensemble_scheduling") or {}
    for i, step in enumerate(scheduling.get("step") or [], 1):
        name = str(step.get("model_name", ""))
        step_config = await source.model_config(name) or {}
        groups = step_config.get("instance_group") or []
        count = sum(int(g.get("count", 1)) for g in groups) or 1
        out.append(Step(i, name, count))
    return out


async def snapshot(source: StatsSource, model: str, steps: list[Step]) -> Snapshot:
    """The counters now (None for a model whose statistics cannot be read)."""
    pipeline = Counters.of(await source.statistics(model))
    counters = tuple([Counters.of(await source.statistics(s.model)) for s in steps])
    return Snapshot(pipeline, counters, time.perf_counter_ns())


def breakdown(
    model: str, steps: list[Step], before: Snapshot, after: Snapshot
) -> dict[str, Any] | None:
    """Per step: queue and compute ms per request, mean batch, busy share; the limiting step."""
    if not steps:
        return None
    wall_ns = max(after.at_ns - before.at_ns, 1)
    rows: list[dict[str, Any]] = []
    for step, b, a in zip(steps, before.steps, after.steps, strict=True):
        row: dict[str, Any] = {"step": step.index, "model": step.model, "instances": step.instances}
        if a is None:
            rows.append({**row, "error": "no statistics for this model"})
            continue
        d = a.minus(b)
        per = max(d.requests, 1)
        row.update(
            requests=d.requests,
            queue_ms=d.queue_ns / per / 1e6,
            compute_ms=d.compute_ns / per / 1e6,
            mean_batch=d.rows / d.batches if d.batches else None,
            busy_ms_per_row=d.busy_ns / d.rows / 1e6 if d.rows else None,
            # The share of the run the step's instances were computing: the busiest limits.
            busy_share=d.busy_ns / (wall_ns * step.instances),
        )
        rows.append(row)
    measured = [r for r in rows if r.get("requests")]
    out: dict[str, Any] = {"pipeline": model, "seconds": wall_ns / 1e9, "steps": rows}
    if after.pipeline is not None:
        d = after.pipeline.minus(before.pipeline)
        out["requests"] = d.requests
        out["server_ms"] = d.request_ns / d.requests / 1e6 if d.requests else None
        in_steps = sum(r["queue_ms"] + r["compute_ms"] for r in measured)
        # What the pipeline adds beyond its steps' queues and batches: hand-overs between steps.
        out["between_steps_ms"] = out["server_ms"] - in_steps if out["server_ms"] else None
    if measured:
        limit = max(measured, key=lambda r: r["busy_share"])
        out["limiting_step"] = {"step": limit["step"], "model": limit["model"]}
    return out


def lines(report: dict[str, Any]) -> list[str]:
    """What the breakdown says in words: the server's time per request, the limiting step."""
    data = report.get("steps")
    if not data:
        return []
    out = []
    if data.get("server_ms") is not None:
        out.append(
            f"pipeline {data['pipeline']}: {data['server_ms']:.3f} ms per request in the server, "
            f"{data['between_steps_ms']:.3f} ms of it between steps (over {data['requests']:,} "
            "requests)"
        )
    limit = data.get("limiting_step")
    if limit is not None:
        row = next(r for r in data["steps"] if r["step"] == limit["step"])
        out.append(
            f"limiting step: {limit['step']} ({limit['model']}): its instances computed "
            f"{row['busy_share']:.0%} of the run, {fmt(row['busy_ms_per_row'], '.3f')} ms per row"
        )
    return out


def table(report: dict[str, Any]) -> Table | None:
    """The per-step table for the terminal."""
    data = report.get("steps")
    if not data:
        return None
    title = f"per step of {data['pipeline']} (statistics extension, whole run)"
    return rich_table(title, COLUMNS, [_cells(row, data) for row in data["steps"]], ("model",))


def markdown(report: dict[str, Any]) -> list[str]:
    """The per-step table and the lines above, as Markdown."""
    data = report.get("steps")
    if not data:
        return []
    table = markdown_table(COLUMNS, [_cells(row, data) for row in data["steps"]], COLUMNS[:2])
    out = ["", f"## Per step of {data['pipeline']}", "", *table, ""]
    return out + [f"- {line}" for line in lines(report)]


COLUMNS = ("step", "model", "instances", "requests", "queue ms", "compute ms", "mean batch",
           "busy ms/row", "busy", "limits")  # fmt: skip


def _cells(row: dict[str, Any], data: dict[str, Any]) -> list[str]:
    if "error" in row:
        return [str(row["step"]), row["model"], str(row["instances"]), row["error"]] + [""] * 6
    limit = (data.get("limiting_step") or {}).get("step") == row["step"]
    return [
        str(row["step"]),
        row["model"],
        str(row["instances"]),
        f"{row['requests']:,}",
        fmt(row["queue_ms"], ".3f"),
        fmt(row["compute_ms"], ".3f"),
        fmt(row["mean_batch"], ".1f"),
        fmt(row["busy_ms_per_row"], ".3f"),
        f"{row['busy_share']:.0%}",
        "<- limits" if limit else "",
    ]
