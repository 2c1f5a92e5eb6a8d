"""Writing the folders of an end-to-end zoo pipeline: its processing steps and the pipeline.

Each step is a model of its own (config.toml and a version folder with its marker or file), so
it batches with its own batcher and shows in the index and statistics; the pipeline's
config.toml names them in [[steps]] (docs/processing.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from dlscale.backends import MODEL_FILES
from dlscale.types import Datatype, TensorSpec

#: What every step waits for company at most: the batcher sends at once when requests arrive
#: further apart than this (its adaptive delay), so a lone request is not held.
STEP_QUEUE_DELAY_US = 200
#: The steps whose version folder holds an empty marker rather than a model file.
MARKED = ("image", "topk", "null")


def write_step(
    root: Path,
    name: str,
    backend: str,
    max_batch_size: int,
    options: Mapping[str, Any],
    files: Mapping[str, bytes] | None = None,
    tensors: tuple[list[TensorSpec], list[TensorSpec]] = ([], []),
    device: str = "cpu",
) -> Path:
    """REPO/<name>/config.toml and 1/ with `files` (name -> bytes) and a step's marker.

    `tensors` declares inputs and outputs (names, datatypes, shapes without the batch dim)
    where the step's own defaults are not what the pipeline hands it. Steps whose inputs are
    text or encoded images get no warm-up requests (a row of zeros is neither): they warm
    themselves at load.
    """
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    given = dict(files or {})
    if backend in MARKED:  # the step reads no model file: an empty marker keeps folders alike
        given.setdefault(MODEL_FILES[backend][0], b"")
    for file, data in given.items():
        (folder / "1" / file).write_bytes(data)
    config: dict[str, Any] = {
        "name": name,
        "backend": backend,
        "max_batch_size": max_batch_size,
        "batching": {"max_queue_delay_us": STEP_QUEUE_DELAY_US},
        "instances": [{"count": 1, "device": device}],
        "backend_options": dict(options),
    }
    inputs, outputs = tensors
    if inputs:
        config["inputs"] = [s.to_dict() for s in inputs]
    if outputs:
        config["outputs"] = [s.to_dict() for s in outputs]
    if backend in ("image", "tokenizer"):
        config["warmup"] = []
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    return folder


def write_pipeline(
    root: Path,
    name: str,
    max_batch_size: int,
    tensors: tuple[list[TensorSpec], list[TensorSpec]],
    steps: list[tuple[str, dict[str, str], dict[str, str]]],
    metadata: Mapping[str, str | int | float] | None = None,
) -> Path:
    """REPO/<name>/config.toml with its [[steps]] (model, input_map, output_map), and 1/."""
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    inputs, outputs = tensors
    config: dict[str, Any] = {
        "name": name,
        "max_batch_size": max_batch_size,
        "inputs": [s.to_dict() for s in inputs],
        "outputs": [s.to_dict() for s in outputs],
        "steps": [
            {"model": model, "input_map": ins, "output_map": outs} for model, ins, outs in steps
        ],
        "metadata": dict(metadata or {}),
    }
    (folder / "config.toml").write_text(tomli_w.dumps(config))
    return folder


def write_topk(root: Path, name: str, max_batch_size: int, k: int, labels: Sequence[str]) -> Path:
    """REPO/<name>: the top-k step over one score per label (its labels.txt), answering the
    `k` best as "score:index:label"."""
    scores = TensorSpec("scores", Datatype.FP32, (len(labels),))
    best = TensorSpec("labels", Datatype.BYTES, (k,))
    text = "\n".join(labels) + "\n"
    files = {"labels.txt": text.encode()}
    return write_step(root, name, "topk", max_batch_size, {"k": k}, files, ([scores], [best]))
