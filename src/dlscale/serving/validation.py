"""What a request may ask of a model: names, datatypes, shapes, batch size, priority, timeout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlscale.errors import InvalidInput, closest, known_names
from dlscale.serving.classification import class_count
from dlscale.serving.regions.cuda import dtype_of
from dlscale.serving.request_plan import RequestPlan
from dlscale.serving.served import ServedVersion
from dlscale.types import Datatype, InferenceRequest, Parameters, TensorSpec


def check(served: ServedVersion, request: InferenceRequest) -> tuple[Mapping[str, int], int]:
    """Check names, datatypes, shapes and batch size; return the outputs to send, each with
    the number of classes asked for (0: the tensor itself), and the inferences the request
    holds (Triton's inference_count: its batch, 1 if it has none), read off the one pass over
    its inputs and the version's plan."""
    plan = served.plan
    rules, inputs = plan.inputs, request.inputs
    if inputs.keys() != rules.keys():
        _refuse_names(plan.model, list(rules), list(inputs))
    batch, mixed = -1, False
    for name, array in inputs.items():
        spec, dtype, rank, fixed = rules[name]
        if array.dtype is not dtype:  # the same dtype object for the usual types: one test
            _check_datatype(plan.model, spec, array)
        shape = array.shape
        if len(shape) != rank:
            _refuse_shape(plan.model, spec, shape)
        for axis, size in fixed:
            if shape[axis] != size:
                _refuse_shape(plan.model, spec, shape)
        if plan.batched:
            if batch < 0:
                batch = shape[0]
            elif shape[0] != batch:
                mixed = True  # said once every input's own checks passed, as before
    if mixed:
        _refuse_batches(plan.model, inputs)
    if plan.batched:
        _check_batch(plan, batch)
    rows = batch if plan.batched and inputs else 1
    if request.outputs is None:
        return plan.every_output, rows
    unknown = [o.name for o in request.outputs if o.name not in plan.outputs]
    if unknown:
        raise InvalidInput(
            f"unknown outputs {unknown} requested from model {plan.model!r}"
            + known_names(unknown[0], list(plan.every_output), "it has")
        )
    return {o.name: class_count(o) for o in request.outputs}, rows


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


def _refuse_batches(model: str, inputs: Mapping[str, Any]) -> None:
    batches = sorted({array.shape[0] for array in inputs.values()})
    raise InvalidInput(f"inputs of model {model!r} disagree on the batch size: {batches}")


def _check_batch(plan: RequestPlan, batch: int) -> None:
    if batch > plan.max_batch_size:
        raise InvalidInput(
            f"batch size {batch} exceeds max_batch_size {plan.max_batch_size} of model "
            f"{plan.model!r}"
        )
    if batch == 0:
        raise InvalidInput(f"batch size 0 for model {plan.model!r}: send at least one row")


def _check_datatype(model: str, spec: TensorSpec, array: Any) -> None:
    """InvalidInput unless the array's dtype is the spec's datatype (BYTES: any of numpy's
    object, bytes or str dtypes, which `Datatype.from_numpy` reads as one). A pipeline step's
    input may be another step's output left on its device (a torch tensor), read by dtype_of."""
    got = Datatype.from_numpy(dtype_of(array))
    if got is not spec.datatype:
        raise InvalidInput(
            f"input {spec.name!r} of model {model!r} has datatype {spec.datatype.value}; the "
            f"request gave {got.value}"
        )


def _refuse_shape(model: str, spec: TensorSpec, shape: tuple[int, ...]) -> None:
    raise InvalidInput(
        f"input {spec.name!r} of model {model!r} has shape {list(spec.shape)}; the request "
        f"gave {list(shape)}"
    )
