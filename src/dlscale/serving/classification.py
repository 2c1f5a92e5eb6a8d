"""Triton's classification extension: an output answered as its top classes, "score:index[:label]".

A requested output with the parameter `classification: k` (REST and gRPC alike; tritonclient's
`class_count=k`) comes back as BYTES of shape [batch, k] (or [k] for a model that does not
batch): per row, the k highest values, highest first, each as "<value>:<index>" with
":<label>" added when the output has a label file (config `label_file`).
"""

from __future__ import annotations

from pathlib import Path

from dlscale.backends.confined import read_confined
from dlscale.errors import InvalidInput
from dlscale.types import RequestedOutput
from dlscale.wire.classification import MAX_LABEL_BYTES, parse_labels

PARAMETER = "classification"


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
    return parse_labels(data)
