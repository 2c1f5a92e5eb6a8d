"""Triton's classification format: a row of scores as its top classes, "score:index[:label]".

The one writer of that format: the server's classification extension (serving/classification.py,
an output asked for with `classification: k`) and the top-k processing step both call it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlscale.errors import InvalidInput

#: Triton refuses to classify more elements per row than this (pathological memory and CPU).
MAX_ELEMENTS = 1_000_000
#: The largest label file read: a million labels of a few dozen characters (issue 28: a config
#: could name any file, and a huge one stalled the server and grew its memory).
MAX_LABEL_BYTES = 32 * 2**20


def parse_labels(data: bytes) -> tuple[str, ...]:
    """A label file's labels: one per line, line n naming class n."""
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
