"""The torch backend on one GPU against PyTorch's own compiled best, in one command.

    PYTHONPATH=/tmp/site:src python -m benchmarks.torch_gpu --out results/torch_gpu

Sized for 10 minutes on an H100 host (16 cores); docs/backends.md says how to carry the wheels
a bare GPU machine lacks. For resnet50 (UINT8 pixels in, normalized on the GPU) and bert-base
(S=128), at batch 256, it
1. compiles AOTInductor packages in background processes (FP16 first; FP8 and INT8 with 1x1
   or all convolutions as 8-bit products);
2. for each model, before its first package: PyTorch alone (torchvision's resnet50, bert-base:
   the zoo's module; FP16, channels_last, torch.compile reduce-overhead with inductor freezing,
   data on the GPU; in a process of its own) and the FP32 answers (eager + CUDA graphs, one
   instance);
3. serves each package as soon as it is compiled, FP16 ones first, through ModelManager +
   Batcher (1 and 2 instances, 2 batches in flight each): Offline, every request of 256 queued
   at once with its inputs in pinned memory, median of --reps runs; and calls it directly;
   8-bit and FP16 answers are checked against FP32 (resnet50: top-1 agreement on 1,024 images
   and top-1 on their labels; bert-base: cosine similarity);
4. loads the first package (resnet50 FP16) in a fresh process with every batch bucket captured;
5. then the other eager rows (FP16, BF16, TF32) and the same model compiled at load.
Steps left when --budget runs out are reported as not run. Writes OUT/torch_gpu.json and
OUT/torch_gpu.md after every row (a run stopped keeps what it measured); `judge --out OUT`
judges a saved OUT/torch_gpu.json's rows again, by today's targets. A dry run of the pipeline
on the CPU:

    PYTHONPATH=src python -m benchmarks.torch_gpu --device cpu --batch 8 --seconds 0.2 \
        --reps 1 --packages mlp:fp32 --eager mlp:fp32 --instances 1 --out /tmp/torch_cpu
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness.torch_gpu_compiles import Compiles
from benchmarks.harness.torch_gpu_report import Row, judge_again, line, markdown, report
from benchmarks.harness.torch_gpu_runs import (
    images_and_labels,
    pytorch_alone,
    sample_batch,
    serve_offline,
    write_served,
)
from dlscale.models.zoo import ZOO
from dlscale.models.zoo.gpu import gpu_serving, write_gpu_entry
from dlscale.models.zoo.inputs import PIXELS, torch_entry

PACKAGES = [
    "resnet50:fp16",
    "bert-base:fp16",
    "resnet50:fp8",
    "resnet50:int8",
    "resnet50:fp8:all",
    "resnet50:int8:all",
    "bert-base:fp8",
    "bert-base:int8",
]
#: FP32 first: its answers are the reference the others are checked against.
EAGER = ["resnet50:fp32", "resnet50:fp16:fp32", "resnet50:fp16", "resnet50:bf16", "resnet50:tf32"]
EAGER += ["bert-base:fp32", "bert-base:fp16", "bert-base:bf16", "bert-base:tf32"]


def main(argv: list[str] | None = None) -> int:
    # A crash in compiled or captured code (SIGSEGV) still prints the Python stack it was in.
    faulthandler.enable()
    args = _parser().parse_args(argv)
    if args.verb == "package":
        return _package_job(args)
    if args.verb == "load":
        return _load_job(args)
    if args.verb == "reference":
        return _reference_job(args)
    if args.verb == "judge":
        print(judge_again(args.out))
        return 0
    if args.device != "cpu" and not torch.cuda.is_available():
        print("torch_gpu: no CUDA device (--device cpu runs a dry run)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dlscale-torch-gpu-") as tmp:
        run = Run(args, Path(tmp), rows, start)
        run.all()
    run.save()
    print((args.out / "torch_gpu.md").read_text())
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "verb", nargs="?", default="run", choices=["run", "package", "load", "reference", "judge"]
    )
    p.add_argument("--out", type=Path, default=Path("results/torch_gpu"))
    p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for a dry run")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=2.0, help="per Offline run")
    p.add_argument("--reps", type=int, default=3, help="Offline runs per variant (median)")
    p.add_argument("--instances", nargs="+", type=int, default=[1, 2])
    p.add_argument("--budget", type=float, default=540.0, help="seconds before skipping")
    p.add_argument("--workers", type=int, default=4, help="packages compiled at once")
    p.add_argument("--packages", nargs="*", default=PACKAGES, help="model:precision[:convs]")
    p.add_argument("--eager", nargs="*", default=EAGER, help="model:precision[:inputs]")
    p.add_argument("--check-images", type=int, default=1024, help="resnet50 top-1 checks")
    p.add_argument("--no-reference", dest="reference", action="store_false")
    # package / load / reference jobs (run by the main process in a fresh one)
    p.add_argument("--spec", help="model:precision[:convs] to package; the reference's model")
    p.add_argument("--dir", type=Path, help="where the job reads or writes its model")
    return p


# -- jobs in fresh processes -------------------------------------------------------------------


def _serving(spec: str, batch: int) -> tuple[str, Any]:
    name, precision, *rest = spec.split(":")
    convs = rest[0] if rest and rest[0] in ("all", "pointwise", "none") else None
    return name, gpu_serving(name, precision=precision, max_batch_size=batch, lowp_convs=convs)


def _package_job(args: argparse.Namespace) -> int:
    """Compile one package into args.dir/<model>/1 and say how long it took (job.json)."""
    name, serving = _serving(args.spec, args.batch)
    start = time.perf_counter()
    result: dict[str, Any]
    try:
        write_gpu_entry(args.dir, name, args.device, serving, package=True)
        result = {"compile_s": time.perf_counter() - start}
    except Exception as exc:  # reported in the row; the benchmark goes on
        result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    (args.dir / "job.json").write_text(json.dumps(result))
    return 0


def _reference_job(args: argparse.Namespace) -> int:
    """PyTorch alone on one model (args.spec); its figures as JSON on the last line."""
    result = pytorch_alone(args.spec, args.batch, args.device, args.seconds, args.reps)
    print(json.dumps(result), flush=True)
    return 0


def _load_job(args: argparse.Namespace) -> int:
    """Load a package as a server would, every default batch bucket captured; print seconds."""
    from dlscale.backends import BackendOptions, create_backend

    package = next(args.dir.glob("*/1/model.aoti.pt2"))
    options = BackendOptions(device=args.device, max_batch_size=args.batch)
    start = time.perf_counter()
    backend = create_backend("torch", package, options)
    backend.load()
    print(json.dumps({"load_s": time.perf_counter() - start}))
    backend.unload()
    return 0


class Run:
    """The benchmark's steps in order, each skipped once the budget is spent."""

    def __init__(self, args: argparse.Namespace, tmp: Path, rows: list[Row], start: float):
        self.args, self.tmp, self.rows, self.start = args, tmp, rows, start
        self.deadline = start + args.budget
        self.compiles = Compiles(args, tmp / "packages")
        self.references: dict[str, dict[str, Any]] = {}  # model -> FP32 outputs and labels
        self.built: dict[str, Path] = {}  # package spec -> its folder, once measured

    def left(self) -> float:
        """Seconds of the budget left."""
        return float(self.deadline - time.perf_counter())

    def save(self) -> None:
        """OUT/torch_gpu.json and .md with the rows so far: a run killed keeps what it measured."""
        data = report(self.rows, self.args, time.perf_counter() - self.start)
        (self.args.out / "torch_gpu.json").write_text(json.dumps(data, indent=2))
        (self.args.out / "torch_gpu.md").write_text(markdown(data))

    def all(self) -> None:
        """The rows, the headline figures first: each package measured right after its compile.

        Before a model's first package come what it is judged against: PyTorch's own compiled
        reference and the FP32 answers (one instance). FP16 packages precede the 8-bit ones;
        the first package's load in a fresh process follows it; the other eager rows come last.
        """
        self.compiles.poll()
        self._checks_data()
        eager = list(self.args.eager)
        judged: set[str] = set()
        ordered = sorted(self.args.packages, key=lambda spec: spec.split(":")[1] != "fp16")
        for spec in ordered:
            name = spec.split(":")[0]
            if name not in judged:
                judged.add(name)
                if self.args.reference:
                    self._pytorch(name)
                if f"{name}:fp32" in eager:
                    eager.remove(f"{name}:fp32")
                    self._eager(f"{name}:fp32", self.args.instances[:1])
            self.compiles.wait_for(spec, self.deadline - 30)
            self._package(spec)
            if spec == ordered[0]:  # resnet50 FP16 by default: its load time is a target
                self._load_in_fresh_process(spec)
        self.compiles.wait(time.perf_counter())  # stops what is still compiling
        for spec in eager:
            self._eager(spec)
        self._compile_at_load()

    # -- steps ---------------------------------------------------------------------------------

    def _checks_data(self) -> None:
        """1,024 labelled images as pixels (resnet50), one batch of tokens (bert-base)."""
        images, labels = images_and_labels(self.args.check_images)
        self.check_pixels = PIXELS["resnet50"].to_pixels(images)
        self.labels = labels

    def _checks(self, name: str, input_type: str) -> list[dict[str, np.ndarray]]:
        b = self.args.batch
        if name == "resnet50":
            data = (
                self.check_pixels
                if input_type == "uint8"
                else PIXELS[name].to_images(self.check_pixels)
            )
            return [{"input": data[i : i + b]} for i in range(0, len(data), b)]
        return [sample_batch(name, b, input_type, "cpu", seed=21)]

    def _measure(
        self,
        row: Row,
        folder: Path,
        packaged: bool,
        extra: dict[str, Any],
        instances: list[int] | None = None,
    ) -> None:
        """Serve the model in `folder` (its 1/ written) with each instance count; fill `row`."""
        name = row.model
        serving = gpu_serving(
            name, precision=row.precision, max_batch_size=self.args.batch, input_type=row.inputs
        )
        inputs = sample_batch(name, self.args.batch, row.inputs, self.args.device)
        for count in instances or self.args.instances:
            if self.left() < 20:
                row.note += " instances left out: budget;"
                break
            serving = replace(serving, instances=count)
            write_served(
                folder,
                name,
                serving,
                self.args.device,
                packaged=packaged,
                buckets=[self.args.batch],
                extra=extra,
            )
            checks = self._checks(name, row.inputs) if count == 1 else None
            served, outputs = serve_offline(
                folder.parent,
                folder.name,
                inputs,
                self.args.batch,
                self.args.seconds,
                self.args.reps,
                checks,
            )
            row.offline[count], row.runs[count] = served.offline, served.runs
            row.direct = max(row.direct, served.direct)
            row.load_s = row.load_s or served.load_s
            if outputs:
                self._judge(row, name, outputs)
        print(line(row), flush=True)

    def _judge(self, row: Row, name: str, outputs: list[dict[str, np.ndarray]]) -> None:
        """FP32 rows become the reference; other rows are compared with it."""
        if row.precision == "fp32" and row.kind == "eager":
            self.references[name] = {"outputs": outputs}
        reference = self.references.get(name)
        if name == "resnet50":
            got = np.concatenate([o["output"] for o in outputs]).argmax(1)
            row.top1 = float(np.mean(got == self.labels[: len(got)]))
            if reference:
                ref = np.concatenate([o["output"] for o in reference["outputs"]]).argmax(1)
                row.agreement = float(np.mean(got == ref))
        elif reference:
            cosines = []
            for key in outputs[0]:
                a = outputs[0][key].reshape(len(outputs[0][key]), -1).astype(np.float64)
                b = reference["outputs"][0][key].reshape(len(a), -1).astype(np.float64)
                cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
                cosines.append(float(cos.mean()))
            row.cosine = min(cosines)

    def _guarded(self, row: Row, step: Any) -> None:
        self.rows.append(row)
        if self.left() < 15:
            row.status = "not run: past the budget"
            self.save()
            return
        try:
            step()
        except Exception as exc:  # reported in its row; the benchmark goes on
            row.status = f"failed: {type(exc).__name__}: {exc}"[:500]
            print(line(row), flush=True)
        self.save()

    def _eager(self, spec: str, instances: list[int] | None = None) -> None:
        name, precision, *rest = spec.split(":")
        inputs = rest[0] if rest else gpu_serving(name).input_type
        row = Row(name, f"eager {precision} ({inputs} in)", "eager", precision, inputs)
        if self.compiles.busy:
            row.note = "measured while packages compiled in the background (CPU busy);"

        def step() -> None:
            folder = self.tmp / "eager" / spec.replace(":", "-")
            torch_entry(ZOO[name], inputs).write(folder / "1" / "model.zoo")  # type: ignore[arg-type]
            self._measure(row, folder, False, {"compile": False}, instances)

        self._guarded(row, step)

    def _pytorch(self, name: str) -> None:
        row = Row(name, "PyTorch alone", "pytorch", "fp16", "on the GPU")

        def step() -> None:
            # In a process of its own: torch.compile's CUDA graphs and inductor state stay out
            # of the process that then loads AOTInductor packages, as a server's would (on the
            # first lent H200 that load crashed the process, right after this ran in it).
            command = [sys.executable, "-m", "benchmarks.torch_gpu", "reference", "--spec", name]
            command += ["--device", self.args.device, "--batch", str(self.args.batch)]
            command += ["--seconds", str(self.args.seconds), "--reps", str(self.args.reps)]
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=max(1.0, self.left() - 15)
            )
            if done.returncode != 0:
                raise RuntimeError(f"exit status {done.returncode}: {done.stderr[-400:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            row.offline[0], row.runs[0] = result["rate"], result["runs"]
            row.compile_s, row.note = result["compile_s"], f"{result['source']} module;"
            print(line(row), flush=True)

        self._guarded(row, step)

    def _package(self, spec: str) -> None:
        name, serving = _serving(spec, self.args.batch)
        convs = f", {serving.lowp_convs} convs" if serving.lowp_convs else ""
        row = Row(
            name,
            f"package {serving.precision}{convs}",
            "package",
            serving.precision,
            serving.input_type,
        )

        def step() -> None:
            folder = self.compiles.done.get(spec)
            job = json.loads((folder / "job.json").read_text()) if folder else {}
            if folder is None or "compile_s" not in job:
                row.status = f"not built: {job.get('error', 'the compile did not finish')}"
                return
            row.compile_s = job["compile_s"]
            self._measure(row, folder / name, True, {})
            self.built[spec] = folder

        self._guarded(row, step)

    def _load_in_fresh_process(self, spec: str) -> None:
        name, precision = spec.split(":")[:2]
        row = Row(name, f"package {precision}: load in a fresh process", "package", precision, "")

        def step() -> None:
            folder = self.built.get(spec)
            if folder is None:
                row.status = f"not run: no {spec} package"
                return
            command = [sys.executable, "-m", "benchmarks.torch_gpu", "load", "--dir", str(folder)]
            command += ["--device", self.args.device, "--batch", str(self.args.batch)]
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            row.load_s = json.loads(done.stdout.strip().splitlines()[-1])["load_s"]
            row.note = (
                f"backend.load() with every default bucket captured; the whole process "
                f"(Python, torch import, load) took {time.perf_counter() - start:.1f} s;"
            )
            print(line(row), flush=True)

        self._guarded(row, step)

    def _compile_at_load(self) -> None:
        row = Row("resnet50", "torch.compile at load fp16", "compile-at-load", "fp16", "uint8")

        def step() -> None:
            folder = self.tmp / "compiled" / "resnet50"
            torch_entry(ZOO["resnet50"], "uint8").write(folder / "1" / "model.zoo")
            self._measure(row, folder, False, {}, instances=self.args.instances[:1])

        if "resnet50:fp16" in self.args.packages:
            self._guarded(row, step)


if __name__ == "__main__":
    sys.exit(main())
