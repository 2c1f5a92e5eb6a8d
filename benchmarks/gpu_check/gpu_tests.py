"""gpu-check's first stage: the gpu tests, run in an order that puts the telling ones first,
and counted by outcome from pytest's lines, which a stop at the budget leaves readable.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from benchmarks.gpu_check.figures import Context, Figure

_RESULT = re.compile(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")
_COLLECTED = re.compile(r"^(tests/\S+::\S+)$")


#: The gpu test files in the order they run: the quick ones first, then the packages (whose
#: load crashed the torch stage on the first lent H200), then the precision matrix, the bulk
#: (36 cases), which the budget may cut; a file not listed here runs last.
GPU_TEST_ORDER = (
    "test_hardware_gpu.py",
    "test_image_gpu.py",
    "test_shm_gpu.py",
    "test_device_workers_gpu.py",
    "test_onnxruntime_gpu.py",
    "test_qos_gpu.py",
    "test_transformers_gpu.py",
    "test_torch_gpu_compiled.py",
    "test_torch_gpu.py",
)


def command(ctx: Context) -> list[str]:
    """The gpu tests listed (collected.txt), then run: a line per test, read even after a kill."""
    per_test = "120" if not ctx.cpu else "60"
    here = sorted(p.name for p in Path("tests/gpu").glob("test_*.py"))
    ordered = [n for n in GPU_TEST_ORDER if n in here] + [
        n for n in here if n not in GPU_TEST_ORDER
    ]
    files = " ".join(f"tests/gpu/{name}" for name in ordered)
    pytest = f"{shlex.quote(ctx.python)} -m pytest -m gpu {files} -p no:cacheprovider"
    listed = f"{pytest} --co -q --continue-on-collection-errors > {ctx.out / 'collected.txt'}"
    run = f"{pytest} -v -rN --continue-on-collection-errors --timeout={per_test}"
    return ["sh", "-c", f"{listed}; exec {run}"]


def read(ctx: Context) -> list[Figure]:
    """Counts by outcome; tests collected but without an outcome were not run (budget)."""
    log = (
        (ctx.out / "log.txt").read_text(errors="replace") if (ctx.out / "log.txt").exists() else ""
    )
    outcomes: dict[str, str] = {}
    for line in log.splitlines():
        if match := _RESULT.match(line):
            outcomes.setdefault(match.group(1), match.group(2))
    errors = len(re.findall(r"^ERROR collecting", log, re.M))
    counts = {k: sum(v == k for v in outcomes.values()) for k in ("PASSED", "FAILED", "SKIPPED")}
    failed = counts["FAILED"] + errors + sum(v == "ERROR" for v in outcomes.values())
    (ctx.out / "outcomes.json").write_text(json.dumps(outcomes, indent=2))
    value = f"{counts['PASSED']} passed, {failed} failed, {counts['SKIPPED']} skipped"
    figures = [
        Figure("gpu tests", value, "0 failed, 0 collection errors", bool(outcomes) and not failed)
    ]
    listed = ctx.out / "collected.txt"
    collected = (
        [m.group(1) for m in map(_COLLECTED.match, listed.read_text().splitlines()) if m]
        if listed.exists()
        else []
    )
    not_run = [t for t in collected if t not in outcomes]
    if not_run:
        (ctx.out / "not_run.txt").write_text("\n".join(not_run) + "\n")
        names = ", ".join(t.split("::")[-1] for t in not_run[:3])
        figures.append(
            Figure(
                "gpu tests not run (past the budget)", f"{len(not_run)}: {names}... (not_run.txt)"
            )
        )
    return figures
