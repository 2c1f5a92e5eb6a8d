"""Run the stages in order within the whole budget, then print the verdict table and write JSON.

    python -m benchmarks.gpu_check [--device cuda|cpu] [--quick] [--only STAGE ...] [--out DIR]

Each stage runs as a child process in its own session, its output in OUT/<stage>/log.txt; one
that would not fit in what is left of --budget is skipped and named, one that runs past its own
budget is stopped (its process group killed) and what it wrote so far is still read. The
verdict table (figure, target, met or not, seconds) comes last, also as OUT/verdict.md, and
everything as OUT/gpu_check.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.figures import Context, Figure
from benchmarks.gpu_check.stages import STAGES, Stage

#: The GPU stages' budgets, summed (540 s): with the wheels' install, one device call of at most
#: 600 s on an H100 (the device tool's per-call limit), with room for the machine's start.
BUDGET_S = sum(s.budget("cuda") for s in STAGES)


@dataclass
class Outcome:
    """What one stage did: ok, failed, stopped at its budget, skipped or not built."""

    stage: str
    about: str
    status: str
    budget_s: float
    seconds: float = 0.0
    figures: list[Figure] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    """Run the stages asked for; 0 when every one that ran finished (targets met or not)."""
    args = _parser().parse_args(argv)
    if args.budget is None:
        args.budget = sum(s.budget(args.device) for s in STAGES)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    outcomes: list[Outcome] = []
    for stage in STAGES:
        if args.only and stage.name not in args.only:
            continue
        left = args.budget - (time.monotonic() - start)
        outcomes.append(_run_stage(stage, args, left))
        _save(outcomes, args, time.monotonic() - start)
        print(f"gpu-check: {stage.name}: {outcomes[-1].status}", flush=True)
    table = verdict_table(outcomes)
    (args.out / "verdict.md").write_text(table + "\n")
    print("\n" + table)
    print(f"\ngpu-check: {time.monotonic() - start:.0f} s; everything in {args.out}/")
    return 1 if any(o.status.startswith(("failed", "stopped")) for o in outcomes) else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="shorter runs (on the CPU: a dry run)")
    p.add_argument("--only", nargs="+", choices=[s.name for s in STAGES], help="these stages")
    p.add_argument("--out", type=Path, default=Path("gpu-check"))
    p.add_argument("--budget", type=float, help=f"seconds for all the stages (GPU: {BUDGET_S:.0f})")
    return p


def _run_stage(stage: Stage, args: argparse.Namespace, left: float) -> Outcome:
    budget = min(stage.budget(args.device), left)
    outcome = Outcome(stage.name, stage.about, "ok", budget)
    if stage.command is None:
        outcome.status = stage.pending
        return outcome
    if left < 0.5 * stage.budget(args.device):
        outcome.status = (
            f"skipped: {left:.0f} s of the budget left, it needs {stage.budget(args.device):.0f}"
            f"; rerun it alone with --only {stage.name}"
        )
        return outcome
    folder = args.out / stage.name
    folder.mkdir(parents=True, exist_ok=True)
    ctx = Context(sys.executable, args.device, args.quick, folder.resolve(), budget)
    why = stage.missing(ctx)
    if why is not None:
        outcome.status = f"skipped: {why}"
        return outcome
    command = stage.command(ctx)
    (folder / "command.txt").write_text(" ".join(command) + "\n")
    started = time.monotonic()
    outcome.status = _run(command, folder / "log.txt", budget)
    outcome.seconds = time.monotonic() - started
    try:
        outcome.figures = stage.read(ctx)
    except Exception as exc:  # a reader's failure is reported in its row; the rest still run
        outcome.figures = [Figure(f"{stage.name} results", f"unreadable: {exc}"[:120], "-", False)]
    return outcome


def _run(command: list[str], log: Path, budget: float) -> str:
    """Run a command in its own session, output to `log`; stop its group at the budget."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return f"stopped at its budget of {budget:.0f} s (what it wrote so far is read)"
    return "ok" if rc == 0 else f"failed: exit status {rc} (see its log.txt)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the stage's process group, SIGKILL after 10 s (servers it started too)."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def verdict_table(outcomes: list[Outcome]) -> str:
    """The Markdown table: one row per figure (a stage without figures gets its status)."""
    lines = ["| stage | figure | value | target | verdict | seconds |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        figures = o.figures or [Figure("-", o.status)]
        for k, f in enumerate(figures):
            verdict = {True: "met", False: "NOT met", None: "-"}[f.met]
            seconds = f"{o.seconds:.0f}" if k == 0 and o.seconds else ""
            stage = o.stage if k == 0 else ""
            if k == 0 and o.status != "ok" and o.figures:  # stopped, yet some figures came
                stage += f": {o.status}"
            lines.append(f"| {stage} | {f.name} | {f.value} | {f.target} | {verdict} | {seconds} |")
    return "\n".join(lines)


def _save(outcomes: list[Outcome], args: argparse.Namespace, seconds: float) -> None:
    """OUT/gpu_check.json, rewritten after each stage."""
    data: dict[str, Any] = {
        "format": "dlscale-gpu-check/1",
        "device": args.device,
        "quick": args.quick,
        "python": platform.python_version(),
        "budget_s": args.budget,
        "took_s": seconds,
        "stages": [asdict(o) for o in outcomes],
    }
    (args.out / "gpu_check.json").write_text(json.dumps(data, indent=2))
