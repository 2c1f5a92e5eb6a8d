"""The `dlscale zoo list` and `dlscale zoo images` verbs; cli.py parses."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from dlscale.types import TensorSpec

#: The table's width when the output is not a terminal.
WIDE = 180


@dataclass(frozen=True)
class Size:
    """A built model's size: parameters (ONNX initializers' elements) and bytes on disk."""

    params: int
    bytes: int

    def __add__(self, other: Size) -> Size:
        return Size(self.params + other.params, self.bytes + other.bytes)

    def show(self) -> str:
        return f"{self.params / 1e6:,.2f} M / {self.bytes / 2**20:,.1f} MiB"


def folder_size(folder: Path) -> Size | None:
    """The size of a model built at `folder` (None when it is not there): its ONNX files'
    parameters and every file's bytes."""
    if not (folder / "config.toml").is_file():
        return None
    import onnx

    params, total = 0, 0
    for path in folder.rglob("*"):
        if not path.is_file():
            continue
        total += path.stat().st_size
        if path.suffix == ".onnx":
            model = onnx.load(str(path), load_external_data=False)
            params += sum(math.prod(t.dims) for t in model.graph.initializer)
    return Size(params, total)


def _tensors(specs: list[TensorSpec]) -> str:
    return ", ".join(f"{s.name} {s.described()}" for s in specs)


def zoo_list(args: argparse.Namespace) -> int:
    """`dlscale zoo list`: every zoo model and pipeline, its task, tensors and (built) size."""
    from rich.console import Console
    from rich.table import Table

    from dlscale.models.zoo import ADAPTERS, DECODERS, PIPELINES, TF_MODELS, ZOO
    from dlscale.wire.generative import INPUTS, OUTPUTS

    table = Table(title=f"The zoo (sizes of what is built in {args.dir})")
    table.add_column("name", no_wrap=True)
    for column in ("task", "inputs", "outputs", "params / bytes"):
        table.add_column(column)
    for model in ZOO.values():
        size = folder_size(args.dir / model.name)
        shown = size.show() if size else "not built"
        inputs, outputs = _tensors(model.inputs()), _tensors(model.outputs())
        table.add_row(model.name, model.task, inputs, outputs, shown)
    for pipeline in PIPELINES.values():
        parts = [folder_size(args.dir / p) for p in (pipeline.name, *pipeline.parts)]
        total = sum((p for p in parts if p), Size(0, 0)) if all(parts) else None
        shown = total.show() if total else "not built"
        task = f"{pipeline.task} (pipeline)"
        inputs, outputs = (_tensors(specs) for specs in pipeline.signature)
        table.add_row(pipeline.name, task, inputs, outputs, shown)
    for net in TF_MODELS.values():  # TensorFlow files: bytes only (no ONNX initializers)
        size = folder_size(args.dir / net.name)
        shown = f"{size.bytes / 2**20:,.1f} MiB" if size else "not built"
        inputs, outputs = _tensors(list(net.inputs)), _tensors(list(net.outputs))
        table.add_row(net.name, f"{net.task} (tensorflow)", inputs, outputs, shown)
    text_in, text_out = _tensors(list(INPUTS)), _tensors(list(OUTPUTS))
    for decoder in DECODERS.values():  # their parameters come from their shape
        size = folder_size(args.dir / decoder.name)
        shown = Size(decoder.parameters(), size.bytes).show() if size else "not built"
        table.add_row(decoder.name, "text generation", text_in, text_out, shown)
    for adapter in ADAPTERS.values():  # served on their base: its tensors
        size = folder_size(args.dir / adapter.name)
        shown = f"{size.bytes / 2**10:,.0f} KiB" if size else "not built"
        task = f"LoRA adapter of {adapter.base.name}"
        table.add_row(adapter.name, task, text_in, text_out, shown)
    console = Console()
    if not console.is_terminal:  # piped or logged: one line per model rather than a squeeze
        console = Console(width=WIDE)
    console.print(table)
    for pipeline in PIPELINES.values():
        console.print(f"{pipeline.name}: {' -> '.join(pipeline.parts)}; {pipeline.description}")
    console.print(f"build one: dlscale zoo build {args.dir} --models NAME")
    return 0


def zoo_images(args: argparse.Namespace) -> int:
    """`dlscale zoo images`: write the synthetic JPEG set to a folder."""
    from dlscale.models.zoo.jpegs import write_jpegs

    width, height = args.size
    paths = write_jpegs(args.out, args.count, args.seed, (height, width))
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} JPEGs ({width}x{height}, {total / 2**10:,.0f} KiB) to {args.out}")
    return 0
