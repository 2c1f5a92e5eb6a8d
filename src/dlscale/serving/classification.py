"""Triton's classification extension: an output answered as its top classes, "score:index[:label]".

A requested output with the parameter `classification: k` (REST and gRPC alike; tritonclient's
`class_count=k`) comes back as BYTES of shape [batch, k] (or [k] for a model that does not
batch): per row, the k highest values, highest first, each as "<value>:<index>" with
":<label>" added when the output has a label file (config `label_file`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.models.confined import read_confined
from dlscale.types import RequestedOutput

PARAMETER = "classification"
#: Triton refuses to classify more elements per row than this (pathological memory and CPU).
MAX_ELEMENTS = 1_000_000
#: The largest label file read: a million labels of a few dozen characters (issue 28: a config
#: could name any file, and a huge one stalled the server and grew its memory).
MAX_LABEL_BYTES = 32 * 2**20


def class_count(output: RequestedOutput) -> int:
    """The classes asked for on a requested output; 0 when it wants the tensor itself."""
    value = output.parameters.get(PARAMETER, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"parameter {PARAMETER!r} of output {output.name!r} must be a non-negative integer "
            f"(the number of classes), got {value!r}"
        )
    return value


def read_labels(folder: Path, name: str) -> tuple[str, ...]:
    """A label file in the model's `folder`: one class label per line, line n naming class n.

    Only a regular file inside the folder, at most MAX_LABEL_BYTES, is read: a config (which a
    load request may send) must not read the host's files, block on a FIFO or fill memory."""
    data = read_confined(folder, name, MAX_LABEL_BYTES, "output's label_file")
    return tuple(data.decode("utf-8", errors="replace").splitlines())


def top_classes(
    array: np.ndarray, count: int, labels: Sequence[str], batched: bool, name: str
) -> np.ndarray:
    """The `count` highest values of each row of `array` as "value:index[:label]" bytes."""
    if array.dtype.kind not in "iuf":
        raise InvalidInput(
            f"output {name!r} has datatype {array.dtype}; classification needs a numeric output"
        )
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    if rows.shape[1] > MAX_ELEMENTS:
        raise InvalidInput(f"output {name!r} is too large to classify ({rows.shape[1]} elements)")
    k = min(count, rows.shape[1])
    index = np.broadcast_to(np.arange(rows.shape[1]), rows.shape)
    # Highest value first; equal values in index order (lexsort sorts by its last key first).
    order = np.lexsort((index, -rows.astype(np.float64)), axis=-1)[:, :k]
    integer = array.dtype.kind in "iu"
    out = np.empty(order.shape, dtype=object)
    for r, row in enumerate(order):
        for c, i in enumerate(row):
            value = rows[r, i]
            # Triton's std::to_string: integers as they are, floats with six decimals.
            text = f"{int(value)}:{i}" if integer else f"{float(value):f}:{i}"
            if i < len(labels):
                text += f":{labels[i]}"
            out[r, c] = text.encode()
    return out if batched and array.ndim else out[0]
