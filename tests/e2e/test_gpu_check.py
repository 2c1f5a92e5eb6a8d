"""`make gpu-check`'s CPU mode: every stage runs, the verdict table comes last, the JSON says it.

The GPU command cannot be run here, so its dry run is: the same runner and stages with
`--device cpu --quick` (the small mlp packaged with AOTInductor and served, the gpu tests
collected and skipped, the two tenants on the CPU), as a child process, as `make gpu-check
GPU_CHECK_ARGS="--device cpu --quick"` runs it after installing the carried wheels.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["tests", "torch", "served", "tenants", "jpeg", "generative"]


@pytest.mark.slow  # 2.5-5 minutes on 2 shared cores: an AOTInductor compile, servers, decoders
def test_the_cpu_mode_runs_every_stage_and_ends_with_the_verdict_table(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--quick"]
    done = subprocess.run(
        [*command, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

    data = json.loads((out / "gpu_check.json").read_text())
    stages = {s["stage"]: s for s in data["stages"]}
    assert list(stages) == STAGES and data["device"] == "cpu"
    for name in STAGES:
        assert stages[name]["status"] == "ok", (name, stages[name])
        assert (out / name / "log.txt").stat().st_size > 0

    def figures(stage: str) -> dict[str, dict[str, object]]:
        return {f["name"]: f for f in stages[stage]["figures"]}

    # The gpu tests were collected and skipped here (no GPU), none failed.
    assert figures("tests")["gpu tests"]["met"] is True
    # The mlp package built, served through the batcher and loaded in a fresh process.
    torch_figures = figures("torch")
    assert any(n.startswith("compile mlp package fp32 (CPU)") for n in torch_figures)
    served = torch_figures["mlp package fp32 through the batcher"]["value"]
    assert not str(served).startswith("0/s")
    assert torch_figures["package load, fresh process"]["value"] != "not measured"
    assert (out / "torch" / "torch_gpu.json").exists()
    # Served over REST and gRPC against in process; CUDA shared memory named as not run.
    served_figures = figures("served")
    for path in ("in-process", "rest", "grpc", "system-shm"):
        assert f"served {path} (mlp)" in served_figures
    assert "no CUDA" in str(served_figures["served cuda-shm"]["value"])
    # Two tenants, QoS off and on, each as a ratio to the tenant alone.
    for qos in ("off", "on"):
        value = figures("tenants")[f"protected p99 with QoS {qos}, of alone"]["value"]
        assert str(value).endswith("x")

    # The JPEG pipeline (smallcnn-e2e here) against its classifier fed the decoded tensors.
    jpeg = figures("jpeg")["smallcnn from JPEGs (CPU decode), of tensors in process"]
    assert str(jpeg["value"]).split("x (")[0].replace(".", "").isdigit()
    assert (out / "jpeg" / "jpeg.json").exists()
    # llama-tiny measured on the CPU beside the plan's prediction for it.
    tiny = figures("generative")["llama-tiny batch 1"]
    assert "tok/s" in str(tiny["value"]) and "plan" in str(tiny["value"])

    # The verdict table is the last thing printed, one row per figure, also in verdict.md.
    lines = done.stdout.rstrip().splitlines()
    header = lines.index("| stage | figure | value | target | verdict | seconds |")
    table = lines[header:-2]
    assert all(line.startswith("|") for line in table) and lines[-1].startswith("gpu-check:")
    assert (out / "verdict.md").read_text().strip() == "\n".join(table)
    assert sum(len(s["figures"]) or 1 for s in data["stages"]) == len(table) - 2
