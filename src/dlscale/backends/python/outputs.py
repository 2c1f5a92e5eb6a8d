"""What a Python model returns, checked against its config before any client sees it.

User code may return any array under any name; Triton checks each output against the model's
config, and so does this: the name is a declared output, the datatype is the declared one, the
shape has the declared rank and fixed dimensions, and a batched output has as many rows as its
request. A wrong output is the model's fault, not the client's: that request alone fails with a
BackendError (500) naming the model and the output; the batch's other requests keep theirs.
Values are not checked (NaN is a legal FP32 number).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dlscale.errors import BackendError
from dlscale.types import Datatype, TensorSpec


def check_outputs(
    model: str,
    specs: Sequence[TensorSpec],
    batched: bool,
    inputs: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
) -> BackendError | None:
    """The error of the first output that breaks the config, or None when all keep it."""
    declared = {spec.name: spec for spec in specs}
    rows = _rows(inputs) if batched else None
    for name, array in outputs.items():
        spec = declared.get(name)
        problem = _problem(spec, array, rows) if spec is not None else "is not declared"
        if problem:
            return BackendError(
                f"model {model!r} returned output {name!r} that {problem} (its config: "
                f"{_declared(spec)}); the model's code must return what its config declares"
            )
    return None


def _problem(spec: TensorSpec, array: object, rows: int | None) -> str:
    if not isinstance(array, np.ndarray):
        return f"is a {type(array).__name__}, not an array"
    try:
        datatype = Datatype.from_numpy(array.dtype)
    except ValueError:
        return f"has numpy dtype {array.dtype}, which no datatype matches"
    if datatype is not spec.datatype:
        return f"has datatype {datatype.value}"
    shape = tuple(array.shape)
    if not spec.matches(shape):
        return f"has shape {list(shape)}"
    if rows is not None and shape[0] != rows:
        return f"has {shape[0]} rows for a request of {rows}"
    return ""


def _declared(spec: TensorSpec | None) -> str:
    return "no such output" if spec is None else spec.described()


def _rows(inputs: Mapping[str, np.ndarray]) -> int | None:
    """A request's rows: its inputs' first dimension (None when it has no input to tell)."""
    for array in inputs.values():
        if isinstance(array, np.ndarray) and array.ndim:
            return int(array.shape[0])
    return None
