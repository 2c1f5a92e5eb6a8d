"""The stages of gpu-check, most important first: what each runs and which figures it reads back.

A stage is one entry of STAGES: its command (per device, full or --quick), its budget and a
reader that turns what the command wrote under its folder into verdict rows. A GPU proof that
lands later (JPEG pipelines, the generative decoder) is one more entry.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.figures import Context, Figure
from benchmarks.gpu_check.generative import command as generative_command
from benchmarks.gpu_check.generative import missing as generative_missing
from benchmarks.gpu_check.generative import read as generative_read
from benchmarks.gpu_check.gpu_tests import command as tests_command
from benchmarks.gpu_check.gpu_tests import read as tests_read

#: Targets from the issue (shared/reference/gpu-measured.md for the figures measured before).
RESNET50_FP16 = 25_800.0
MOONSHOT = 36_730.0
BERT_FP16 = 15_600.0
LOAD_S = 10.0
CUDA_SHM_OF_IN_PROCESS = 0.9
REST_BEFORE = 1_246.0
REST_FACTOR = 4.0
P99_WITH_QOS = 1.2
JPEG_OF_TENSORS = 0.8


@dataclass
class Stage:
    """One proof: its name, its budget on a GPU and on the CPU, its command and its reader.

    The CPU budgets are generous (6x what each stage took at load 7-10, the torch compile 3x):
    the CPU run checks that the command works, not how fast, on machines shared with other work.
    """

    name: str
    about: str
    gpu_budget_s: float
    cpu_budget_s: float
    command: Callable[[Context], list[str]] | None
    read: Callable[[Context], list[Figure]] = field(default=lambda ctx: [])
    #: Why it is not built, for the stages still to come.
    pending: str = ""
    #: Why it cannot run here (None: it can), asked before it starts.
    missing: Callable[[Context], str | None] = field(default=lambda ctx: None)

    def budget(self, device: str) -> float:
        """Seconds this stage may take on the device given."""
        return self.cpu_budget_s if device == "cpu" else self.gpu_budget_s


def _fmt(value: float) -> str:
    return f"{value:,.0f}"


# -- 2. the torch backend against PyTorch's compiled reference ----------------------------------


def torch_command(ctx: Context) -> list[str]:
    """benchmarks.torch_gpu with this stage's budget (it skips and says what did not fit)."""
    command = [ctx.python, "-m", "benchmarks.torch_gpu", "--out", str(ctx.out)]
    command += ["--budget", str(int(ctx.budget_s - 20))]
    if ctx.cpu:
        # What a CPU allows: the mlp packaged in FP32 and served, no PyTorch reference.
        command += ["--device", "cpu", "--batch", "8", "--seconds", "0.2", "--reps", "1"]
        command += ["--packages", "mlp:fp32", "--eager", "mlp:fp32", "--instances", "1"]
        command += ["--no-reference", "--check-images", "16", "--workers", "1"]
    elif ctx.quick:
        command += ["--reps", "1", "--seconds", "1", "--eager", "resnet50:fp32", "bert-base:fp32"]
    return command


def torch_read(ctx: Context) -> list[Figure]:
    """The targets of resnet50 and bert-base FP16, the 8-bit moonshot, load and compile times."""
    path = ctx.out / "torch_gpu.json"
    rows: list[dict[str, Any]] = json.loads(path.read_text())["rows"] if path.exists() else []
    ok = [r for r in rows if r["status"] == "ok"]

    def best(model: str, kind: str, precision: str) -> float:
        found = [
            r["best"]
            for r in ok
            if (r["model"], r["kind"], r["precision"]) == (model, kind, precision)
        ]
        return max(found, default=0.0)

    figures = []
    for model, target in (("resnet50", RESNET50_FP16), ("bert-base", BERT_FP16)):
        got, reference = best(model, "package", "fp16"), best(model, "pytorch", "fp16")
        if ctx.cpu and not got:
            continue
        value = f"{_fmt(got)}/s (PyTorch compiled alone: {_fmt(reference)}/s)"
        figures.append(
            Figure(
                f"{model} FP16 package through the batcher",
                value,
                f">= {_fmt(target)}/s",
                got >= target,
            )
        )
    lowp = [r for r in ok if r["model"] == "resnet50" and r["precision"] in ("fp8", "int8")]
    if lowp or not ctx.cpu:
        top = max(
            lowp, key=lambda r: r["best"] if (r["agreement"] or 0) >= 0.99 else 0.0, default=None
        )
        value = "not measured"
        if top is not None:
            agreement = top["agreement"] or 0
            value = f"{_fmt(top['best'])}/s, {top['variant']}, top-1 agreement {agreement:.2%}"
        met = top is not None and top["best"] >= MOONSHOT and (top["agreement"] or 0) >= 0.99
        figures.append(
            Figure(
                "resnet50 FP8/INT8 moonshot", value, f">= {_fmt(MOONSHOT)}/s at >= 99% top-1", met
            )
        )
    loads = [r for r in rows if "fresh process" in r["variant"]]
    if loads:
        load = loads[0]["load_s"]
        value = "not measured" if load is None else f"{load:.1f} s ({loads[0]['model']})"
        figures.append(
            Figure(
                "package load, fresh process",
                value,
                f"< {LOAD_S:.0f} s",
                load is not None and load < LOAD_S,
            )
        )
    device = "CPU" if ctx.cpu else "GPU"
    for r in rows:
        if r["kind"] == "package":
            if r["compile_s"] is not None:
                figures.append(
                    Figure(
                        f"compile {r['model']} {r['variant']} ({device})", f"{r['compile_s']:.0f} s"
                    )
                )
            if ctx.cpu and r["status"] == "ok" and "fresh" not in r["variant"]:
                figures.append(
                    Figure(
                        f"{r['model']} {r['variant']} through the batcher", f"{_fmt(r['best'])}/s"
                    )
                )
            elif r["status"] != "ok":
                figures.append(Figure(f"{r['model']} {r['variant']}", r["status"][:90]))
    return figures or [Figure("torch backend rows", "none written", "rows", False)]


# -- 3. served against in process ---------------------------------------------------------------


def served_command(ctx: Context) -> list[str]:
    """benchmarks.shm_gpu: in process, binary REST, gRPC, system and CUDA shared memory."""
    command = [ctx.python, "-m", "benchmarks.shm_gpu", "--out", str(ctx.out)]
    if ctx.cpu:
        return [
            *command,
            "--device",
            "cpu",
            "--model",
            "mlp",
            "--batch",
            "8",
            "--duration",
            "1",
            "--repeats",
            "1",
        ]
    if ctx.quick:
        return [*command, "--duration", "5", "--repeats", "1"]
    return [*command, "--duration", "8", "--repeats", "1"]


def served_read(ctx: Context) -> list[Figure]:
    """CUDA shared memory against in process, binary REST against the figure before."""
    path = ctx.out / "served.json"
    if not path.exists():
        return [Figure("served paths", "none measured", "all five paths", False)]
    data = json.loads(path.read_text())
    medians, ratios = data.get("medians", {}), data.get("ratios", {})
    figures = [
        Figure(
            f"served {p} ({data['model']})", f"{_fmt(v)}/s, {ratios.get(p, 0):.0%} of in process"
        )
        for p, v in medians.items()
    ]
    cuda = ratios.get("cuda-shm")
    if not ctx.cpu or cuda is not None:
        value = "not measured" if cuda is None else f"{cuda:.2f}x"
        figures.append(
            Figure(
                "CUDA shared memory of in process",
                value,
                f">= {CUDA_SHM_OF_IN_PROCESS}x",
                cuda is not None and cuda >= CUDA_SHM_OF_IN_PROCESS,
            )
        )
    rest = medians.get("rest")
    if not ctx.cpu:
        value = "not measured" if rest is None else f"{_fmt(rest)}/s ({rest / REST_BEFORE:.1f}x)"
        target = f">= {REST_FACTOR:.0f}x {_fmt(REST_BEFORE)} = {_fmt(REST_FACTOR * REST_BEFORE)}/s"
        figures.append(
            Figure(
                "binary REST against before",
                value,
                target,
                rest is not None and rest >= REST_FACTOR * REST_BEFORE,
            )
        )
    for path_name, why in data.get("not_run", {}).items():
        figures.append(Figure(f"served {path_name}", f"not run: {why}"))
    return figures


# -- 4. tenants ---------------------------------------------------------------------------------


def tenants_command(ctx: Context) -> list[str]:
    """benchmarks.interference, QoS off and on beside the tenant alone."""
    command = [ctx.python, "-m", "benchmarks.interference", "--device", ctx.device]
    if ctx.cpu:
        # A fixed objective skips the calibration runs: the ratio to alone is the figure here.
        return [*command, "--repeats", "1", "--duration", "1", "--objective", "50"]
    return [*command, "--repeats", "2", "--duration", "5" if not ctx.quick else "3"]


def tenants_read(ctx: Context) -> list[Figure]:
    """The protected tenant's p99 with QoS off and on, as a ratio to its p99 alone."""
    runs = sorted(Path("bench-results").glob(f"interference-{ctx.device}-*/report.json"))
    fresh = [r for r in runs if r.stat().st_mtime >= ctx.out.stat().st_mtime]
    if not fresh:
        return [
            Figure(
                "protected p99 with QoS on, of alone", "not measured", f"<= {P99_WITH_QOS}x", False
            )
        ]
    shutil.copytree(fresh[-1].parent, ctx.out / "report", dirs_exist_ok=True)
    summary = json.loads(fresh[-1].read_text())["summary"]["conditions"]
    ratios = {c["condition"]: c.get("p99_ratio") for c in summary}
    figures = []
    for condition in ("off", "on"):
        ratio = ratios.get(condition)
        value = "not measured" if ratio is None else f"{ratio:.2f}x"
        if condition == "on":
            figures.append(
                Figure(
                    "protected p99 with QoS on, of alone",
                    value,
                    f"<= {P99_WITH_QOS}x",
                    ratio is not None and ratio <= P99_WITH_QOS,
                )
            )
        else:
            figures.append(Figure("protected p99 with QoS off, of alone", value))
    return figures


def _ort_cuda_missing(ctx: Context) -> str | None:
    """Why the ONNX tenants cannot run on the GPU here: onnxruntime without its CUDA provider."""
    if ctx.cpu:
        return None
    probe = "import onnxruntime as o; print('CUDAExecutionProvider' in o.get_available_providers())"
    found = subprocess.run([ctx.python, "-c", probe], capture_output=True, text=True, check=False)
    if found.stdout.strip() == "True":
        return None
    return (
        "its tenants are ONNX models and this onnxruntime has no CUDA provider (a CPU build, "
        "as on the lent H100 image); install onnxruntime-gpu to run it"
    )


# -- 5. JPEG pipelines ---------------------------------------------------------------------------


def jpeg_command(ctx: Context) -> list[str]:
    """benchmarks.gpu_check.jpeg: resnet50-e2e from JPEGs against resnet50 fed tensors."""
    command = [ctx.python, "-m", "benchmarks.gpu_check.jpeg", "--out", str(ctx.out)]
    if ctx.cpu:  # smallcnn-e2e, libjpeg-turbo: the path, not a figure
        return [*command, "--device", "cpu", "--seconds", "0.5", "--reps", "1", "--batch", "16",
                "--images", "32"]  # fmt: skip
    return [*command, "--device", "cuda:0", "--seconds", "1" if ctx.quick else "3"]


def jpeg_read(ctx: Context) -> list[Figure]:
    """The JPEG pipeline's rate as a share of its classifier's fed decoded tensors."""
    path = ctx.out / "jpeg.json"
    name = "resnet50 FP16 from JPEGs decoded on the device, of tensors in process"
    if ctx.cpu:
        name = "smallcnn from JPEGs (CPU decode), of tensors in process"
    target = "-" if ctx.cpu else f">= {JPEG_OF_TENSORS}x"
    if not path.exists():
        return [Figure(name, "not measured", target, None if ctx.cpu else False)]
    data = json.loads(path.read_text())
    value = (
        f"{data['ratio']:.2f}x ({_fmt(data['jpegs_per_s'])}/s from JPEGs, "
        f"{_fmt(data['tensors_per_s'])}/s from tensors, batch {data['batch']})"
    )
    met = None if ctx.cpu else data["ratio"] >= JPEG_OF_TENSORS
    return [Figure(name, value, target, met)]


def _nvjpeg_missing(ctx: Context) -> str | None:
    """Why the image step cannot decode on the GPU here: torchvision or the CPU decoders absent."""
    if ctx.cpu:
        return None
    probe = "import torchvision.io, simplejpeg, PIL"
    found = subprocess.run([ctx.python, "-c", probe], capture_output=True, text=True, check=False)
    if found.returncode == 0:
        return None
    lines = found.stderr.strip().splitlines()
    return f"the image step needs torchvision (nvJPEG), simplejpeg and Pillow: {lines[-1:]}"


STAGES = [
    Stage(
        "tests",
        "the gpu tests that fit (pytest -m gpu tests/gpu)",
        80,
        240,
        tests_command,
        tests_read,
    ),
    Stage(
        "torch",
        "resnet50 / bert-base packages through the batcher against PyTorch compiled",
        220,
        480,
        torch_command,
        torch_read,
    ),
    Stage(
        "served",
        "resnet50 FP16 served: REST, gRPC, system and CUDA shared memory",
        80,
        300,
        served_command,
        served_read,
    ),
    Stage(
        "tenants",
        "two tenants on the GPU, QoS off and on",
        50,
        240,
        tenants_command,
        tenants_read,
        missing=_ort_cuda_missing,
    ),
    Stage(
        "jpeg",
        "resnet50-e2e from JPEGs decoded on the device against resnet50 fed tensors",
        40,
        240,
        jpeg_command,
        jpeg_read,
        missing=_nvjpeg_missing,
    ),
    Stage(
        "generative",
        "llama-1b on transformers: tokens/s, TTFT, TPOT against dlscale plan's prediction",
        70,
        300,
        generative_command,
        generative_read,
        missing=generative_missing,
    ),
]
