"""A TensorFlow Serving request's inputs as named arrays: the row format (`instances`), the
columnar format (`inputs`) and tf.Example features (classify, regress).

Rows are stacked along a new first dimension, the batch; columns are tensors as they are. A
feature of an example is one row of the input of that name, reshaped to the input's row shape
where that is fixed (a tf.Example feature is a flat list).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dlscale.errors import InvalidInput
from dlscale.frontends.tfserving.values import is_b64, spec_of, to_array
from dlscale.types import ModelMetadata, TensorSpec

Arrays = dict[str, np.ndarray]


def _named(value: Any) -> bool:
    return isinstance(value, dict) and not is_b64(value)


def from_rows(instances: Any, meta: ModelMetadata, most: int) -> Arrays:
    """`instances`: a list of rows, each the one input's value or an object naming inputs."""
    if not isinstance(instances, list) or not instances:
        raise InvalidInput("'instances' must be a non-empty list of rows")
    if not _named(instances[0]):
        if any(_named(row) for row in instances):
            raise InvalidInput(
                "'instances' mixes rows that are objects naming inputs with rows that are values"
            )
        only = _only(meta)
        return {only.name: to_array(instances, only, most)}
    keys = set(instances[0])
    for index, row in enumerate(instances):
        if not _named(row):
            raise InvalidInput(
                f"instance {index} is not an object naming inputs, as instance 0 is: every "
                "row must have the same form"
            )
        if set(row) != keys:
            raise InvalidInput(
                f"instance {index} names inputs {sorted(row)[:20]}, instance 0 names "
                f"{sorted(keys)[:20]}: every row must name the same inputs"
            )
    return {
        name: to_array([row[name] for row in instances], spec_of(meta, name), most)
        for name in instances[0]
    }


def from_columns(inputs: Any, meta: ModelMetadata, most: int) -> Arrays:
    """`inputs`: the one input's value, or an object naming each input's whole tensor."""
    if not _named(inputs):
        only = _only(meta)
        return {only.name: to_array(inputs, only, most)}
    return {name: to_array(value, spec_of(meta, name), most) for name, value in inputs.items()}


def from_examples(
    examples: Sequence[Mapping[str, Any]],
    context: Mapping[str, Any],
    meta: ModelMetadata,
    most: int,
) -> Arrays:
    """Examples as rows: each feature (with the context's, shared by every example) one input's
    row, reshaped to that input's row shape when it is fixed."""
    if not examples:
        raise InvalidInput("'examples' must be a non-empty list of examples")
    # A feature is a list of values (tf.Example's); a lone value is a list of one.
    rows = [{k: _listed(v) for k, v in {**context, **example}.items()} for example in examples]
    arrays = from_rows(rows, meta, most)
    for name, array in arrays.items():
        row = spec_of(meta, name).shape[1:]
        if row and min(row) >= 0 and math.prod(array.shape[1:]) == math.prod(row):
            arrays[name] = array.reshape((array.shape[0], *row))
    return arrays


def _listed(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


def _only(meta: ModelMetadata) -> TensorSpec:
    if len(meta.inputs) != 1:
        names = ", ".join(repr(s.name) for s in meta.inputs)
        raise InvalidInput(
            f"model {meta.name!r} has {len(meta.inputs)} inputs ({names}): name each, with an "
            "object of input name to value"
        )
    return meta.inputs[0]
