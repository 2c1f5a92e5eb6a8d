"""`make gpu-check`'s CPU mode: the stages run, the verdict table comes last, the JSON says it.

The GPU command cannot be run here, so its dry run is: the same runner and stages with
`--device cpu --quick` (the gpu tests collected and skipped, the small mlp served, the two
tenants on the CPU, the JPEG pipeline, llama-tiny against the plan; the mlp packaged with
AOTInductor and served), as a child process, as `make gpu-check GPU_CHECK_ARGS="--device cpu
--quick"` runs it after installing the carried wheels.

Every stage has a budget on the CPU, and the runner stops one that overruns it and says so:
that is the limit of these tests, not pytest's 300 s (`timeout` below is only the net under
the runner's budgets). The default run takes two stages (tenants, JPEG: the runner, two readers
and the verdict table, about a minute); every stage (the gpu tests' collection and the served
paths too: 137 s of a quiet 2-core run, past the served stage's budget beside two CPU burners)
and the torch stage, an AOTInductor compile of 2-3 minutes on 2 cores, run
in `make test-slow`; the default run keeps the compile itself
(tests/unit/optimize/test_torch_build.py) and benchmarks/torch_gpu.py's serve-check-report
path on the CPU (tests/integration/optimize/test_torch_gpu_benchmark.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.toolkit.slow import slow_only

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["tests", "served", "tenants", "jpeg", "generative"]
#: The CPU budgets of STAGES (benchmarks/gpu_check/stages.py) and of the torch stage, summed,
#: with a minute for the runner itself.
STAGES_BUDGET_S, TORCH_BUDGET_S = 240 + 300 + 240 + 240 + 300 + 60, 480 + 60


def _dry_run(out: Path, stages: list[str]) -> tuple[subprocess.CompletedProcess[str], Any]:
    """`python -m benchmarks.gpu_check --device cpu --quick --only STAGES`; its JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick"]
    # The tenants stage writes its benchmark's results where `make gpu-check` keeps them, in
    # the checkout's bench-results/: this run's are removed, the user's kept.
    results = ROOT / "bench-results"
    kept = set(results.glob("interference-cpu-*"))
    try:
        done = subprocess.run(
            [*command, "--only", *stages, "--out", str(out)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    finally:
        for made in set(results.glob("interference-cpu-*")) - kept:
            shutil.rmtree(made, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    data = json.loads((out / "gpu_check.json").read_text())
    assert [s["stage"] for s in data["stages"]] == stages and data["device"] == "cpu"
    for stage in data["stages"]:
        assert stage["status"] == "ok", stage
        assert (out / stage["stage"] / "log.txt").stat().st_size > 0
    return done, data


def _figures(data: Any, stage: str) -> dict[str, dict[str, object]]:
    [found] = [s for s in data["stages"] if s["stage"] == stage]
    return {f["name"]: f for f in found["figures"]}


def _served(data: Any, out: Path) -> None:
    """Served over REST and gRPC against in process; CUDA shared memory named as not run."""
    served_figures = _figures(data, "served")
    for path in ("in-process", "rest", "grpc", "system-shm"):
        assert f"served {path} (mlp)" in served_figures
    assert "no CUDA" in str(served_figures["served cuda-shm"]["value"])


def _tenants(data: Any, out: Path) -> None:
    """Two tenants, QoS off and on, each as a ratio to the tenant alone."""
    for qos in ("off", "on"):
        value = _figures(data, "tenants")[f"protected p99 with QoS {qos}, of alone"]["value"]
        assert str(value).endswith("x")


def _jpeg(data: Any, out: Path) -> None:
    """The JPEG pipeline (smallcnn-e2e here) against its classifier fed the decoded tensors."""
    jpeg = _figures(data, "jpeg")["smallcnn from JPEGs (CPU decode), of tensors in process"]
    assert str(jpeg["value"]).split("x (")[0].replace(".", "").isdigit()
    assert (out / "jpeg" / "jpeg.json").exists()


def _generative(data: Any, out: Path) -> None:
    """llama-tiny measured on the CPU beside the plan's prediction for it."""
    tiny = _figures(data, "generative")["llama-tiny batch 1"]
    assert "tok/s" in str(tiny["value"]) and "plan" in str(tiny["value"])


def _tests(data: Any, out: Path) -> None:
    """The gpu tests were collected and skipped here (no GPU), none failed."""
    assert _figures(data, "tests")["gpu tests"]["met"] is True


CHECKS = {
    "tests": _tests, "served": _served, "tenants": _tenants, "jpeg": _jpeg,
    "generative": _generative,
}  # fmt: skip


@pytest.mark.slow  # a minute on 2 shared cores, two or more beside other work
@pytest.mark.timeout(STAGES_BUDGET_S)
@pytest.mark.parametrize(
    "stages",
    [
        pytest.param(["tenants", "jpeg"], id="two-stages"),
        # The gpu tests' collection and the served paths: 137 s of a quiet 2-core run.
        pytest.param(STAGES, id="every-stage", marks=slow_only("every stage: 2-3 minutes")),
    ],
)
def test_the_cpu_mode_runs_the_stages_and_ends_with_the_verdict_table(
    tmp_path: Path, stages: list[str]
) -> None:
    out = tmp_path / "gpu-check"
    done, data = _dry_run(out, stages)
    for stage in stages:
        CHECKS[stage](data, out)

    # The verdict table is the last thing printed, one row per figure, also in verdict.md.
    lines = done.stdout.rstrip().splitlines()
    header = lines.index("| stage | figure | value | target | verdict | seconds |")
    table = lines[header:-2]
    assert all(line.startswith("|") for line in table) and lines[-1].startswith("gpu-check:")
    assert (out / "verdict.md").read_text().strip() == "\n".join(table)
    assert sum(len(s["figures"]) or 1 for s in data["stages"]) == len(table) - 2


@pytest.mark.slow
@slow_only("the torch stage compiles the mlp with AOTInductor: 2-3 minutes on 2 cores")
@pytest.mark.timeout(TORCH_BUDGET_S)
def test_the_cpu_mode_packages_the_mlp_and_serves_it(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    _, data = _dry_run(out, ["torch"])
    # The mlp package built, served through the batcher and loaded in a fresh process.
    torch_figures = _figures(data, "torch")
    assert any(n.startswith("compile mlp package fp32 (CPU)") for n in torch_figures)
    served = torch_figures["mlp package fp32 through the batcher"]["value"]
    assert not str(served).startswith("0/s")
    assert torch_figures["package load, fresh process"]["value"] != "not measured"
    assert (out / "torch" / "torch_gpu.json").exists()
