"""`dlscale demo`: build the zoo, then show each model running in-process."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dlscale.models.flops import count
from dlscale.models.repository import ModelRepository
from dlscale.models.runner import run_model
from dlscale.models.zoo import ZOO, build_zoo

QUICK_MODELS = ("identity", "mlp", "digits")


def ensure_zoo(root: Path, names: list[str], console: Console) -> ModelRepository:
    """Build the zoo models that are not in `root` yet; built ones are reused."""
    missing = [n for n in names if not (root / n / "1" / "model.onnx").is_file()]
    if missing:
        console.print(f"building zoo models {missing} into {root} (once; later runs reuse them)")
        build_zoo(root, missing, progress=lambda msg: console.print(f"  {msg}"))
    return ModelRepository(root)


def run_demo(root: Path, *, quick: bool = False) -> int:
    """Build the zoo and print, per model, its cost, batch-1 latency and batch-32 throughput."""
    console = Console()
    names = list(QUICK_MODELS) if quick else list(ZOO)
    repo = ensure_zoo(root, names, console)
    table = Table(title="dlscale zoo, in-process on this CPU (ONNX Runtime)")
    for column in ("model", "GFLOP/sample", "batch-1 latency (ms)", "batch-32 samples/s"):
        table.add_column(column, justify="right" if column != "model" else "left")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("running models", total=len(names))
        for name in names:
            progress.update(task, description=f"running {name}")
            version = repo.version(name)
            cost = count(version.model_file)
            one, many = run_model(version, 32, min_seconds=1.0)
            table.add_row(
                name,
                f"{cost.flops / 1e9:.3f}",
                f"{one.median_ms:.2f}",
                f"{many.throughput:,.1f}",
            )
            progress.advance(task)
    console.print(table)
    return 0
