"""`dlscale demo`: build the zoo, run it in-process, serve it, and benchmark it through it."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dlscale.bench.http_client import HttpClient
from dlscale.bench.report import make_console, print_summary
from dlscale.bench.runner import bench
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import BenchOptions
from dlscale.models.flops import count
from dlscale.models.repository import ModelRepository
from dlscale.models.runner import run_model
from dlscale.models.samples import stored_inputs
from dlscale.models.zoo import PIPELINES, ZOO, build_zoo
from dlscale.models.zoo.jpegs import synthetic_jpegs, synthetic_pixels
from dlscale.server import Server, ServerSettings, ServerThread

QUICK_MODELS = ("identity", "mlp", "digits")
#: MLPerf's 15 ms bound for ResNet-50 assumes an accelerator; two CPU cores need about 100 ms
#: for one image, so the demo's Server run uses a bound this machine can meet.
DEMO_LATENCY_BOUND_S = 2.0
#: The seed of the one synthetic JPEG the tour classifies.
DEMO_IMAGE_SEED = 3


def ensure_zoo(root: Path, names: list[str], console: Console) -> ModelRepository:
    """Build the zoo models that are not in `root` yet; built ones are reused."""
    missing = [n for n in names if not (root / n / "1" / "model.onnx").is_file()]
    if missing:
        console.print(f"building zoo models {missing} into {root} (once; later runs reuse them)")
        build_zoo(root, missing, progress=lambda msg: console.print(f"  {msg}"))
    return ModelRepository(root)


def ensure_pipeline(root: Path, name: str, console: Console) -> list[str]:
    """Build the end-to-end pipeline `name` unless it is there; the models it needs, itself last."""
    pipeline = PIPELINES[name]
    if not (root / name / "config.toml").is_file():
        console.print(f"building {name} into {root} (once)")
        pipeline.build(root)
    return [*pipeline.parts, name]


async def jpeg_over_rest(url: str, pipeline: str) -> tuple[list[str], float]:
    """One synthetic JPEG through `pipeline` over REST: its top-5 labels and round trip (ms)."""
    client = HttpClient(url)
    await client.open()
    try:
        image = np.array([synthetic_jpegs(1, seed=DEMO_IMAGE_SEED)], dtype=object)
        await client.infer(pipeline, {"image": image})  # the first request warms the path
        start = time.perf_counter()
        answer = await client.infer(pipeline, {"image": image})
        elapsed = (time.perf_counter() - start) * 1000
    finally:
        await client.close()
    return [item.decode() for item in answer["labels"].ravel()], elapsed


def show_jpeg(url: str, pipeline: str, console: Console) -> None:
    """Step 3 of the tour: one JPEG classified end to end by the server."""
    size = len(synthetic_jpegs(1, seed=DEMO_IMAGE_SEED)[0])
    truth = int(synthetic_pixels(1, seed=DEMO_IMAGE_SEED)[1][0])
    labels, ms = asyncio.run(jpeg_over_rest(url, pipeline))
    parts = " -> ".join(PIPELINES[pipeline].parts)
    console.print(
        f"\n3. One JPEG classified end to end: {pipeline} ({parts}), over REST\n"
        f"   a 500x375 JPEG of {size / 1024:.1f} KB (drawn from class pattern-{truth:02d}) "
        f"in, its top-5 out in {ms:.1f} ms:"
    )
    for label in labels:
        score, _, name = label.split(":", 2)
        console.print(f"     {name:<12} {float(score):8.3f}")


def in_process_table(repo: ModelRepository, names: list[str], console: Console) -> Table:
    """Per model: GFLOP per sample, batch-1 latency and batch-32 throughput, no server."""
    table = Table(title="1. In-process on this CPU (ONNX Runtime, no server)")
    for column in ("model", "GFLOP/sample", "batch-1 latency (ms)", "batch-32 samples/s"):
        table.add_column(column, justify="left" if column == "model" else "right")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("running models", total=len(names))
        for name in names:
            progress.update(task, description=f"running {name}")
            version = repo.version(name)
            one, many = run_model(version, 32, min_seconds=1.0)
            table.add_row(
                name,
                f"{count(version.model_file).flops / 1e9:.3f}",
                f"{one.median_ms:.2f}",
                f"{many.throughput:,.1f}",
            )
            progress.advance(task)
    return table


@contextmanager
def serving(root: Path, models: list[str]) -> Iterator[Server]:
    """`dlscale serve` on free loopback ports, in a thread of this process, for the demo."""
    settings = ServerSettings.build(
        root,
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        model_control="explicit",
        load_models=tuple(models),
    )
    with ServerThread(settings) as running:
        yield running.server


async def digits_over_rest(url: str, version_dir: Path) -> tuple[int, int]:
    """Send digits' held-out images through the REST API; (correct, total) against the labels."""
    data = stored_inputs(version_dir)
    if data is None or "labels" not in data:
        return 0, 0
    client = HttpClient(url)
    await client.open()
    try:
        images, labels = data["input"], data["labels"]
        chunks = [slice(i, i + 16) for i in range(0, len(images), 16)]
        answers = await asyncio.gather(
            *(client.infer("digits", {"input": images[c]}) for c in chunks)
        )
    finally:
        await client.close()
    predicted = np.concatenate([a["output"].argmax(axis=1) for a in answers])
    return int((predicted == labels).sum()), len(labels)


def demo(args: argparse.Namespace) -> int:
    """`dlscale demo`, the whole tour: zoo, in-process figures, the server, LoadGen through it."""
    root, quick = args.dir, args.quick
    console = make_console()
    names = list(QUICK_MODELS) if quick else list(ZOO)
    repo = ensure_zoo(root, names, console)
    console.print(in_process_table(repo, names, console))

    # The quick tour shows the JPEG path on the small CNN; the full one on resnet50.
    pipeline = "smallcnn-e2e" if quick else "resnet50-e2e"
    served = list(dict.fromkeys([*names, *ensure_pipeline(root, pipeline, console)]))
    console.print(f"\n2. Serving {served} over REST, gRPC and Prometheus metrics (loopback)")
    with serving(root, served) as server:
        ports = server.ports
        http = f"http://127.0.0.1:{ports['http']}"
        console.print(
            f"   REST {http}, gRPC 127.0.0.1:{ports['grpc']}, "
            f"metrics http://127.0.0.1:{ports['metrics']}/metrics"
        )
        correct, total = asyncio.run(digits_over_rest(http, repo.version("digits").path))
        console.print(
            f"   digits through REST: {correct}/{total} held-out images right "
            f"({100 * correct / max(total, 1):.1f}% top-1; recorded at build: "
            f"{repo.config('digits').metadata.get('top1', '?')})"
        )
        show_jpeg(http, pipeline, console)
        model = "mlp" if quick else "resnet50"
        console.print(f"\n4. MLPerf LoadGen through the server: {model}, Offline and Server")
        out = Path(".dlscale/demo-bench")
        options = BenchOptions(
            model=model,
            scenarios=[Scenario.OFFLINE, Scenario.SERVER],
            duration_s=5.0,
            latency_bound_s=DEMO_LATENCY_BOUND_S,
            progress=True,
        )
        result = bench(http, options, out)
        print_summary(result, console)
        if any(not s["result"]["valid"] for s in result["scenarios"] if s.get("result")):
            console.print(
                "   INVALID is LoadGen's verdict, not an error: the lines above say whether the "
                "run missed its p99 bound at the offered rate (performance constraints) or had "
                "too few queries to estimate its p99 (MLPerf early stopping). To find the "
                f"highest rate that holds: dlscale bench --repo {root} --model {model} "
                "--scenario server --find-peak"
            )
        console.print(f"   report: {out / 'report.md'} (JSON, LoadGen logs and plots beside it)")
    return 0
