"""Samples for models that take BYTES (encoded images, text): files of a folder, or the zoo's sets.

A folder gives one element per file: each regular file's bytes are one request's row of the
model's one BYTES input (a JPEG, a PNG, a UTF-8 text). Files are taken in name order, hidden
files and anything not a regular file (links, folders, devices) left out, so a folder cannot
lead the bench outside itself; every size is bounded before it is read: the entries listed, each
file, and all of them together (the bench's memory budget). Without a folder, a model whose
BYTES input is an image gets the zoo's synthetic JPEGs and one whose input is text the zoo's
sentences (docs/bench.md, "BYTES inputs").
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlscale.errors import BenchError
from dlscale.types import Datatype, TensorSpec

#: Entries of a folder listed at most: a folder of millions of files is refused, not walked.
MAX_ENTRIES = 100_000
#: One file's bytes at most (a request's element; the server bounds its own body too).
MAX_FILE_BYTES = 64 << 20


def bytes_input(specs: Sequence[TensorSpec]) -> TensorSpec | None:
    """The model's one BYTES input when it has exactly one input and that is BYTES."""
    if len(specs) == 1 and specs[0].datatype is Datatype.BYTES:
        return specs[0]
    return None


def from_folder(
    folder: Path, specs: Sequence[TensorSpec], count: int, budget_bytes: int
) -> tuple[dict[str, np.ndarray], str]:
    """Up to `count` files of `folder`, at most `budget_bytes` in all, as the one BYTES input."""
    spec = _one_row_input(specs, str(folder))
    chosen: list[bytes] = []
    total = 0
    for path in _files(folder):
        if len(chosen) >= count:
            break
        data = _read_bounded(path)
        if total + len(data) > budget_bytes and chosen:
            break  # the memory budget: fewer samples, said in the source
        chosen.append(data)
        total += len(data)
    if not chosen:
        raise BenchError(f"data folder {folder} holds no regular, non-hidden file to send")
    source = f"{folder} ({len(chosen)} files, {total / 1e6:.1f} MB)"
    return {spec.name: _column(chosen)}, source


def from_zoo(
    name: str, specs: Sequence[TensorSpec], count: int, seed: int
) -> tuple[dict[str, np.ndarray], str] | None:
    """The zoo's synthetic JPEGs for an image input, its sentences for a text input; None when
    the model's one BYTES input is neither (the caller then asks for a folder)."""
    spec = bytes_input(specs)
    if spec is None:
        return None
    kind = _kind(name, spec)
    if kind == "image":
        from dlscale.models.zoo.jpegs import synthetic_jpegs

        images = synthetic_jpegs(count, seed)
        return {spec.name: _column(images)}, f"zoo:synthetic-jpegs ({count}, seed {seed})"
    if kind == "text":
        from dlscale.models.zoo.text import sentences

        texts, _ = sentences(count, seed)
        return {spec.name: _column([t.encode() for t in texts])}, f"zoo:sentences ({count})"
    return None


def _kind(name: str, spec: TensorSpec) -> str:
    """image or text: the zoo pipeline's task, else the input's name; "" when neither."""
    from dlscale.models.zoo.e2e import PIPELINES

    pipeline = PIPELINES.get(name)
    if pipeline is not None:
        return "image" if "image" in pipeline.task else "text" if "text" in pipeline.task else ""
    lowered = spec.name.lower()
    if lowered in ("image", "images", "jpeg", "jpg", "png"):
        return "image"
    if lowered in ("text", "texts", "sentence", "prompt"):
        return "text"
    return ""


def _one_row_input(specs: Sequence[TensorSpec], source: str) -> TensorSpec:
    spec = bytes_input(specs)
    if spec is None:
        described = [f"{s.name} ({s.datatype.value})" for s in specs]
        raise BenchError(
            f"a data folder ({source}) gives one BYTES element per file: it fits models with one "
            f"BYTES input; this one takes {described} (use .npy or .npz)"
        )
    if tuple(spec.shape) not in ((1,), (-1,)):
        raise BenchError(
            f"a data folder ({source}) gives one element per request row; input {spec.name!r} "
            f"takes {list(spec.shape)} elements per row"
        )
    return spec


def _files(folder: Path) -> list[Path]:
    """The folder's regular, non-hidden files in name order; links are not followed."""
    if not folder.is_dir():
        raise BenchError(f"data folder {folder} is not a folder")
    names: list[str] = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if len(names) >= MAX_ENTRIES:
                    raise BenchError(
                        f"data folder {folder} has more than {MAX_ENTRIES:,} entries; give a "
                        "folder with fewer files"
                    )
                if not entry.name.startswith(".") and entry.is_file(follow_symlinks=False):
                    names.append(entry.name)
    except OSError as exc:
        raise BenchError(f"data folder {folder} cannot be read: {exc}") from None
    return [folder / n for n in sorted(names)]


def _read_bounded(path: Path) -> bytes:
    """The file's bytes, refused past MAX_FILE_BYTES before (and while) it is read."""
    try:
        # O_NOFOLLOW: a file swapped for a link after the listing is refused, not followed.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_FILE_BYTES:
                raise BenchError(_too_large(path))
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise BenchError(f"data file {path} cannot be read: {exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise BenchError(_too_large(path))
    return data


def _too_large(path: Path) -> str:
    return f"data file {path} is larger than {MAX_FILE_BYTES >> 20} MiB, the bound on one element"


def _column(elements: list[bytes]) -> np.ndarray:
    """[N, 1] BYTES: one element per sample row."""
    return np.array(elements, dtype=object).reshape(-1, 1)
