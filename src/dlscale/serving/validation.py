"""What a request may ask of a model: names, datatypes, shapes, batch size, priority, timeout."""

from __future__ import annotations

import numpy as np

from dlscale.errors import InvalidInput, closest, known_names
from dlscale.serving.classification import class_count
from dlscale.serving.served import ServedVersion
from dlscale.types import Datatype, InferenceRequest, Parameters, TensorSpec


def validate(served: ServedVersion, request: InferenceRequest) -> dict[str, int]:
    """Check names, datatypes, shapes and batch size; return the outputs to send, each with
    the number of classes asked for (0: the tensor itself)."""
    model = served.version.name
    expected = served.input_specs
    if request.inputs.keys() != expected.keys():
        _refuse_names(model, list(expected), list(request.inputs))
    for name, array in request.inputs.items():
        _check_input(model, expected[name], array)
    if served.config.batched:
        _check_batch(served, request)
    names = served.output_names
    if request.outputs is None:
        return dict.fromkeys(names, 0)
    unknown = [o.name for o in request.outputs if o.name not in names]
    if unknown:
        raise InvalidInput(
            f"unknown outputs {unknown} requested from model {model!r}"
            + known_names(unknown[0], names, "it has")
        )
    return {o.name: class_count(o) for o in request.outputs}


def _refuse_names(model: str, expected: list[str], sent: list[str]) -> None:
    """Raise InvalidInput for inputs that are missing or not the model's."""
    missing = [n for n in expected if n not in sent]
    extra = [n for n in sent if n not in expected]
    if missing:
        # A misspelt name is both missing and extra: say which of the missing it resembles.
        match = closest(extra[0], missing) if extra else None
        raise InvalidInput(
            f"model {model!r} expects inputs {sorted(expected)}; the request lacks {missing}"
            + (f" and sent {extra[0]!r} (did you mean {match!r}?)" if match else "")
        )
    raise InvalidInput(
        f"unexpected inputs {extra} for model {model!r}"
        + known_names(extra[0], expected, "it takes")
    )


def check_schedule_parameters(params: Parameters) -> None:
    """`priority` and `timeout` are non-negative integers, whichever protocol carried them."""
    if not params:  # most requests carry no parameters
        return
    for key in ("priority", "timeout"):
        value = params.get(key)
        if value is None:
            continue
        # Not bool (an int subclass), string or float: 2.0, inf or nan are refused alike.
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(
                f"parameter {key!r} must be a non-negative integer, got {value!r}"
                + (" (microseconds)" if key == "timeout" else ""),
                key,
            )


def rows(served: ServedVersion, request: InferenceRequest) -> int:
    """Inferences a request holds (Triton's inference_count): its batch, 1 if it has none."""
    if not served.config.batched or not request.inputs:
        return 1
    return int(next(iter(request.inputs.values())).shape[0])


def _check_batch(served: ServedVersion, request: InferenceRequest) -> None:
    model, config = served.version.name, served.config
    batches = {array.shape[0] for array in request.inputs.values()}
    if len(batches) > 1:
        raise InvalidInput(
            f"inputs of model {model!r} disagree on the batch size: {sorted(batches)}"
        )
    batch = batches.pop()
    if batch > config.max_batch_size:
        raise InvalidInput(
            f"batch size {batch} exceeds max_batch_size {config.max_batch_size} of model {model!r}"
        )
    if batch == 0:
        raise InvalidInput(f"batch size 0 for model {model!r}: send at least one row")


def _check_input(model: str, spec: TensorSpec, array: np.ndarray) -> None:
    got = Datatype.from_numpy(array.dtype)
    if got is not spec.datatype:
        raise InvalidInput(
            f"input {spec.name!r} of model {model!r} has datatype {spec.datatype.value}; the "
            f"request gave {got.value}"
        )
    if not spec.matches(array.shape):
        raise InvalidInput(
            f"input {spec.name!r} of model {model!r} has shape {list(spec.shape)}; the request "
            f"gave {list(array.shape)}"
        )
