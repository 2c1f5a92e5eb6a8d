"""The report of benchmarks/torch_gpu.py: JSON, a Markdown table and the issue's targets."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

#: Published and measured anchors (shared/reference/mlperf.md, gpu-measured.md).
MLPERF_H100_RESNET50 = 91_826
TARGETS = {"resnet50": 25_800.0, "bert-base": 1.5 * 10_400, "load_s": 10.0, "moonshot": 36_730.0}


@dataclass
class Row:
    """One line of the report."""

    model: str
    variant: str
    kind: str  # package, eager (+ CUDA graphs), compile-at-load, pytorch
    precision: str
    inputs: str
    status: str = "ok"
    offline: dict[int, float] = field(default_factory=dict)  # instances -> median samples/s
    runs: dict[int, list[float]] = field(default_factory=dict)
    direct: float = 0.0
    compile_s: float | None = None
    load_s: float | None = None
    agreement: float | None = None
    top1: float | None = None
    cosine: float | None = None
    note: str = ""

    @property
    def best(self) -> float:
        """The best median Offline rate over instance counts."""
        return max(self.offline.values(), default=0.0)


def line(r: Row) -> str:
    """One row as a progress line."""
    if r.status != "ok":
        return f"{r.model} {r.variant}: {r.status}"
    rates = ", ".join(f"{k} inst {v:,.0f}/s" for k, v in sorted(r.offline.items()))
    extra = f" agreement {r.agreement:.2%}" if r.agreement is not None else ""
    return f"{r.model} {r.variant}: {rates}, direct {r.direct:,.0f}/s, load {r.load_s}{extra}"


def report(rows: list[Row], args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """Everything measured, with the machine and the targets' verdicts."""
    on_gpu = args.device != "cpu"
    return {
        "device": torch.cuda.get_device_name(0) if on_gpu else f"CPU ({os.cpu_count()} cores)",
        "capability": list(torch.cuda.get_device_capability(0)) if on_gpu else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "batch": args.batch,
        "reps": args.reps,
        "seconds_per_run": args.seconds,
        "took_s": seconds,
        "targets": TARGETS,
        "mlperf_h100_resnet50_offline": MLPERF_H100_RESNET50,
        "verdicts": verdicts(rows),
        "rows": _saved(rows),
    }


def _saved(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) | {"best": r.best} for r in rows]


def judge_again(out: Path) -> str:
    """OUT/torch_gpu.json's rows judged by today's targets: the report (.json, .md) rewritten
    with the new verdicts, and its Markdown returned. The rows are read as they were saved."""
    path = out / "torch_gpu.json"
    saved = json.loads(path.read_text())
    rows = [_row(r) for r in saved["rows"]]
    data = saved | {"targets": TARGETS, "verdicts": verdicts(rows), "rows": _saved(rows)}
    path.write_text(json.dumps(data, indent=2))
    (out / "torch_gpu.md").write_text(markdown(data))
    return markdown(data)


def _row(saved: dict[str, Any]) -> Row:
    """A Row from its JSON: the instance counts, keys there, are numbers again."""
    row = Row(**{f.name: saved[f.name] for f in dataclasses.fields(Row) if f.name in saved})
    row.offline = {int(k): v for k, v in row.offline.items()}
    row.runs = {int(k): v for k, v in row.runs.items()}
    return row


def verdicts(rows: list[Row]) -> list[str]:
    """The issue's targets, each met or not by what this run measured."""

    def best(model: str, kind: str, precision: str) -> float:
        wanted = (model, kind, precision)
        ok = [r.best for r in rows if (r.model, r.kind, r.precision) == wanted and r.status == "ok"]
        return max(ok, default=0.0)

    out = []
    for model in ("resnet50", "bert-base"):
        got, target = best(model, "package", "fp16"), TARGETS[model]
        reference = best(model, "pytorch", "fp16")
        verdict = "met" if got >= target else "not met" if got else "not measured in this run"
        out.append(
            f"{model} FP16 through the batcher: {got:,.0f}/s against {target:,.0f} ({verdict}); "
            f"PyTorch alone {reference:,.0f}/s"
        )
    loads = [r for r in rows if "fresh process" in r.variant and r.load_s]
    if loads:
        met = "met" if (loads[0].load_s or 0) < TARGETS["load_s"] else "not met"
        out.append(f"{loads[0].model} package load: {loads[0].load_s:.1f} s against < 10 s ({met})")
    for r in rows:
        if r.model != "resnet50" or r.precision not in ("fp8", "int8") or r.status != "ok":
            continue
        ok = r.best >= TARGETS["moonshot"] and (r.agreement or 0) >= 0.99
        out.append(
            f"moonshot {r.variant}: {r.best:,.0f}/s, top-1 agreement {(r.agreement or 0):.2%} "
            f"({'met' if ok else 'not met'})"
        )
    return out


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}%"


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table and the targets' verdicts."""
    lines = [
        f"# torch backend on {report['device']} (torch {report['torch']}, CUDA {report['cuda']})",
        "",
        f"Batch {report['batch']}; Offline through ModelManager + Batcher, median of "
        f"{report['reps']} runs of {report['seconds_per_run']} s; inputs in pinned host memory "
        "(PyTorch alone: on the GPU). Took {:.0f} s.".format(report["took_s"]),
        "",
        "| model | variant | inputs | samples/s (1 / 2 instances) | direct | compile s | load s "
        "| top-1 agreement / cosine | top-1 | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        rates = " / ".join(f"{v:,.0f}" for _, v in sorted(r["offline"].items())) or "–"
        judged = _pct(r["agreement"])
        if r["agreement"] is None and r["cosine"] is not None:
            judged = f"{r['cosine']:.4f}"
        secs = [("–" if v is None else f"{v:.1f}") for v in (r["compile_s"], r["load_s"])]
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['inputs']} | {rates} | {r['direct']:,.0f} | "
            f"{secs[0]} | {secs[1]} | {judged} | {_pct(r['top1'])} | {r['status']} {r['note']} |"
        )
    lines += ["", "## Targets", ""] + [f"- {v}" for v in report["verdicts"]] + [""]
    return "\n".join(lines)
