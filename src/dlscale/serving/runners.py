"""One runner per served version: what the core calls, whatever the model's kind.

A served version is one of three kinds: batched tensors (a `Batcher` over its instances), a
pipeline (its steps, each a model with a runner of its own), or a model that streams its
answers (`Seats` in front of a generative engine or a decoupled Python model). The DataPlane,
the model manager and the metrics call its `Runner` only, never asking which kind it is, so a
rule for all kinds (refusing early, the shutdown's cut, a dead backend's failure, closing with a
grace) is written once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from dlscale.errors import DlscaleError, InvalidInput
from dlscale.serving.batcher import Batcher
from dlscale.serving.batches import Tensors
from dlscale.serving.observe.stats import RequestTimes
from dlscale.serving.pipeline import Pipeline, Serve
from dlscale.serving.seats import Seats
from dlscale.types import InferenceRequest, ModelKind

#: Called once a runner reads a request's inputs no more (a shared-memory region's lease).
Release = Callable[[], None]


class Runner(Protocol):
    """The calls the core makes of one served version."""

    #: How the model answers (its metadata carries it to the frontends).
    kind: ModelKind

    @property
    def models(self) -> tuple[str, ...]:
        """The other models it calls (a pipeline's steps); none for a model of its own."""
        ...

    def refuse_early(self) -> DlscaleError | None:
        """The refusal a request meets now by the model's [qos] admission, or None."""
        ...

    def submit(
        self,
        request: InferenceRequest,
        times: RequestTimes,
        release: Release | None,
        step: Serve,
    ) -> Awaitable[Tensors]:
        """Queue a validated unary request; its outputs, or its DlscaleError, when computed.

        `times` receives its timestamps; `release` is called once the runner reads the inputs
        no more (a shared-memory region's lease); `step` is how a pipeline serves its steps
        (the DataPlane's path, less its shutdown check). Arguments, not an object: one call
        per request.
        """
        ...

    def cut(self, error: DlscaleError) -> None:
        """The shutdown's grace is over: what it still holds ends now with `error`."""
        ...

    def fail(self, error: DlscaleError) -> None:
        """Its backend can serve no more: new requests are refused, those waiting fail now."""
        ...

    async def close(self, grace_s: float | None = None) -> None:
        """Refuse new requests; return once those it holds have ended (or, with `grace_s`, at
        most that many seconds later, ending those still queued)."""
        ...


class BatchRunner:
    """Batched tensors: a request joins a batch of its model's `Batcher`."""

    kind = ModelKind.TENSORS
    models: tuple[str, ...] = ()

    def __init__(self, batcher: Batcher) -> None:
        self.batcher = batcher

    def refuse_early(self) -> DlscaleError | None:
        return self.batcher.queue.refuse_early()  # one call less: every gRPC request asks

    def submit(
        self,
        request: InferenceRequest,
        times: RequestTimes,
        release: Release | None,
        step: Serve,
    ) -> Awaitable[Tensors]:
        if not request.parameters:  # most requests: the model's own priority and timeout
            return self.batcher.submit(request.inputs, 0, 0, release, times)
        return self.batcher.submit(
            request.inputs, request.priority, request.timeout_us, release, times
        )

    def cut(self, error: DlscaleError) -> None:
        self.batcher.cut(error)

    def fail(self, error: DlscaleError) -> None:
        self.batcher.fail(error)

    async def close(self, grace_s: float | None = None) -> None:
        await self.batcher.close(grace_s)


class PipelineRunner:
    """A pipeline: each step goes back through the DataPlane to its own model's runner."""

    kind = ModelKind.PIPELINE

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        #: Its step models, each once, in step order.
        self.models = pipeline.config.step_models

    def refuse_early(self) -> DlscaleError | None:
        return None  # each step's own admission answers

    def submit(
        self,
        request: InferenceRequest,
        times: RequestTimes,
        release: Release | None,
        step: Serve,
    ) -> Awaitable[Tensors]:
        return self.pipeline.run(request, step)

    def cut(self, error: DlscaleError) -> None:
        """Nothing of its own: its steps' runners are cut."""

    def fail(self, error: DlscaleError) -> None:
        """Nothing of its own: a step whose backend died fails its own requests."""

    async def close(self, grace_s: float | None = None) -> None:
        """Nothing of its own: its steps' runners close with their models."""


def streams_only(runner: object, request: InferenceRequest, *_: object) -> Awaitable[Tensors]:
    """`submit` of the runners that stream: never called, since the DataPlane sends their
    requests down the stream path (serving/streams.py) by their kind."""
    raise InvalidInput(
        f"model {request.model_name!r} streams its answers: its requests take the stream path"
    )


class StreamRunner:
    """A model that streams its answers: its `Seats`, and streams.py's path through them."""

    models: tuple[str, ...] = ()

    def __init__(self, seats: Seats) -> None:
        self.seats = seats
        self.kind = ModelKind.GENERATIVE if seats.generative else ModelKind.STREAMS

    def refuse_early(self) -> DlscaleError | None:
        return self.seats.queue.refuse_early()

    submit = streams_only

    def cut(self, error: DlscaleError) -> None:
        self.seats.cut()

    def fail(self, error: DlscaleError) -> None:
        self.seats.fail(error)

    async def close(self, grace_s: float | None = None) -> None:
        await self.seats.queue.close()  # once its streams end (or the shutdown's cut)


def seats_of(runner: Runner) -> Seats | None:
    """The seats of a runner that streams its answers; None for the other kinds."""
    return runner.seats if isinstance(runner, StreamRunner) else None
