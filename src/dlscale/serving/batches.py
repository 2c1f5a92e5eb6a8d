"""What the Batcher moves around: a pending request, and how requests merge into a batch and
the batch's outputs split back into each request's rows."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlscale.errors import BackendError, DlscaleError
from dlscale.serving.observe.otel import CURRENT
from dlscale.serving.observe.stats import RequestTimes

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


@dataclass(eq=False, slots=True)  # one per request
class Pending:
    """A request waiting for, or inside, a batch."""

    inputs: Mapping[str, np.ndarray]
    rows: int
    key: tuple[object, ...]  # requests merge only when every non-batch shape and dtype agree
    level: int
    enqueued: float  # seconds on the batcher's clock
    future: asyncio.Future[Tensors]
    times: RequestTimes | None = None  # filled in as the request is queued and computed
    timer: asyncio.TimerHandle | None = None
    queued: bool = True
    #: Whether it arrived with no other request in flight after a lone batch (policy.Company).
    alone: bool = False
    #: Called once the batcher no longer reads the inputs (they may be views of shared memory).
    release: Callable[[], None] | None = None
    #: The OTLP span of the traced request that sent it (None: not traced): the model calls
    #: its batch makes are that request's children (serving/observe/otel.py).
    span: Any = None


def merge_key(inputs: Mapping[str, Any], batched: bool) -> tuple[object, ...]:
    """What requests must share to merge into one batch: each input's name, array type, dtype
    and shape past the batch dimension (the whole shape when the model does not batch)."""
    if len(inputs) == 1:  # most models: one input, nothing to sort
        ((name, arr),) = inputs.items()
        return ((name, type(arr), arr.dtype.str, arr.shape[1:] if batched else arr.shape),)
    return tuple(
        (name, type(arr), arr.dtype.str, arr.shape[1:] if batched else arr.shape)
        for name, arr in sorted(inputs.items())
    )


def merge(batch: Sequence[Pending]) -> Tensors:
    """The batch's inputs: each request's rows one after the other (one request: as it came)."""
    if len(batch) == 1:
        return dict(batch[0].inputs)
    names = batch[0].inputs.keys()
    return {n: np.concatenate([i.inputs[n] for i in batch]) for n in names}


def split(outputs: Tensors, batch: Sequence[Pending], rows: int, batched: bool) -> list[Tensors]:
    """Each request's rows of the outputs (views); BackendError when the rows do not add up."""
    if not batched:
        return [outputs]
    for name, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != rows:
            raise BackendError(
                f"output {name!r} has shape {list(arr.shape)}, but the batch had {rows} rows"
            )
    parts, start = [], 0
    for item in batch:
        end = start + item.rows
        parts.append({n: a[start:end] for n, a in outputs.items()})
        start = end
    return parts


def deliver(
    batch: Sequence[Pending],
    parts: Sequence[Tensors | DlscaleError],
    stamps: tuple[int, int, int, int],
    rows: int,
) -> None:
    """Each request of a computed batch of `rows` gets its compute `stamps` and its part (or
    its own error), unless it has left."""
    for item, part in zip(batch, parts, strict=True):
        times = item.times
        if times is not None:
            (
                times.compute_start,
                times.compute_input_end,
                times.compute_output_start,
                times.compute_end,
            ) = stamps
            times.batch_rows = rows
        if item.future.done():
            continue
        if isinstance(part, DlscaleError):  # this request alone failed
            item.future.set_exception(part)
        else:
            item.future.set_result(part)


def traced_context(batch: Sequence[Pending]) -> contextvars.Context | None:
    """The context a batch computes in: with a traced request in it, that request's span is
    current there, so that a model call the batch makes (BLS) is its child; None otherwise."""
    for item in batch:  # a loop, not `next` over a generator: asked once a batch
        if item.span is not None:
            context = contextvars.copy_context()
            context.run(CURRENT.set, item.span)
            return context
    return None


def fail(batch: Sequence[Pending], exc: DlscaleError) -> None:
    """Deliver `exc` to every request of the batch still waiting."""
    for item in batch:
        if not item.future.done():
            item.future.set_exception(exc)


def within(rows: Sequence[int], limit: int) -> int:
    """How many leading requests fit in `limit` rows; the first always (it cannot be split)."""
    total = 0
    for n, r in enumerate(rows):
        total += r
        if total > limit:
            return max(n, 1)
    return len(rows)


def ns(seconds: float) -> int:
    """Statistics keep nanoseconds, as Triton's do."""
    return round(seconds * 1e9)


def outcome(
    instance: str,
    batch: list[Pending],
    rows: int,
    outputs: Tensors | Sequence[Tensors | DlscaleError] | None,
    error: BaseException | None,
    batched: bool,
) -> Sequence[Tensors | DlscaleError] | None:
    """Each request's part of a batch's outputs (`batched`: split by rows), or of the requests'
    own results; None when the batch failed on `instance` (its requests then have the error)."""
    try:
        if error is not None:
            raise error
        if isinstance(outputs, dict):
            return split(outputs, batch, rows, batched)
        assert outputs is not None  # the requests' own results
        return outputs
    except DlscaleError as exc:
        fail(batch, exc)
    except Exception as exc:  # a backend bug must fail its batch, not the server
        log.exception("instance %s failed a batch of %d rows", instance, rows)
        fail(batch, BackendError(f"the model failed on a batch of {rows}: {exc!r}"))
    return None
