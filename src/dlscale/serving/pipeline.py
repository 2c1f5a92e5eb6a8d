"""Pipelines (Triton's ensembles): a DAG of steps, each a model with its own batcher.

A pipeline runs on the event loop. Each step becomes a typed InferenceRequest that takes the
same path as a client's (the DataPlane's validation, the step model's batcher, its statistics
and traces), carrying the pipeline request's priority and what is left of its timeout. A step's
outputs are handed to the next steps as the same numpy arrays; steps whose inputs exist run at
once, so parallel branches run concurrently (a chain, where nothing could run at once, runs its
steps in turn in the request's own task). docs/configuration.md ("Pipelines") says more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import numpy as np

from dlscale.errors import ConfigError, DlscaleError, InvalidInput, TimedOut
from dlscale.models.config import ModelConfig, StepConfig
from dlscale.types import Datatype, InferenceRequest, InferenceResponse, TensorSpec

#: How deep pipelines may nest (a pipeline whose step is a pipeline is 2 deep): each level
#: adds frames to a request's stack, and a 400-deep chain answered every request 500 with a
#: RecursionError (issue 33). Triton's nested ensembles stay a few levels deep.
MAX_NESTING = 16


class StepModel(Protocol):
    """A loaded step model, as a pipeline checks it (serving/manager.py: StepModel); a
    protocol, so that the manager, which builds pipelines, and this module do not import each
    other."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    @property
    def config(self) -> ModelConfig: ...

    @property
    def pipeline(self) -> Pipeline | None: ...


#: The path a step's request takes: the DataPlane's, less its shutdown check (a pipeline that
#: was admitted before shutdown finishes all its steps).
Serve = Callable[[InferenceRequest], Awaitable[InferenceResponse]]
#: A loaded model version by name and version ("" for the newest): the manager's `get`.
Lookup = Callable[[str, str], StepModel]


class Pipeline:
    """One pipeline version: its steps, checked against the loaded step models, and their run."""

    def __init__(self, name: str, config: ModelConfig) -> None:
        if config.steps is None:
            raise ValueError(f"model {name!r} is not a pipeline")
        self.name = name
        self.config = config
        self.steps: tuple[StepConfig, ...] = tuple(config.steps)
        #: Each step model's priority levels, as loaded (check() sets them).
        self.levels: tuple[int, ...] = (1,) * len(self.steps)
        #: Whether the steps form a chain: each waits for the one before it, so that running
        #: them one after the other in the request's own task loses no concurrency and saves a
        #: task and a future per step and tensor (`_chain`).
        self.chained = _is_chain(self.steps, {s.name for s in self._specs("inputs")})
        self._answers = tuple(s.name for s in self._specs("outputs"))  # read once, not per request
        #: The deepest chain of pipelines this one heads, itself first (check() sets it).
        self.nesting: tuple[str, ...] = (name,)

    # -- at load -------------------------------------------------------------------------------

    def check(self, lookup: Lookup) -> None:
        """Refuse, at load, steps that cannot take what the pipeline hands them; errors name
        the step. Every step model must be loaded already."""
        made: dict[str, tuple[Datatype, str]] = {
            s.name: (s.datatype, "the pipeline input") for s in self._specs("inputs")
        }
        served = [self._served(i, step, lookup) for i, step in enumerate(self.steps, 1)]
        self._check_nesting(served)
        for i, (step, version) in enumerate(zip(self.steps, served, strict=True), 1):
            outputs = {s.name: s for s in version.outputs}
            unknown = sorted(set(step.output_map) - set(outputs))
            if unknown:
                raise self._refusal(i, step, f"has no outputs {unknown} (it has {sorted(outputs)})")
            for name, tensor in step.output_map.items():
                made[tensor] = (outputs[name].datatype, f"step {i}'s output {name!r}")
        for i, (step, version) in enumerate(zip(self.steps, served, strict=True), 1):
            self._check_inputs(i, step, version, made)
        self.levels = tuple(v.config.batching.priority_levels for v in served)
        for spec in self._specs("outputs"):
            datatype, origin = made[spec.name]
            if datatype is not spec.datatype:
                raise ConfigError(
                    f"pipeline {self.name!r}: output {spec.name!r} is declared "
                    f"{spec.datatype.value}, but {origin} is {datatype.value}"
                )

    def _check_nesting(self, served: list[StepModel]) -> None:
        inner = max((v.pipeline.nesting for v in served if v.pipeline), key=len, default=())
        self.nesting = (self.name, *inner)
        check_nesting(self.nesting)

    def _served(self, index: int, step: StepConfig, lookup: Lookup) -> StepModel:
        try:
            version = lookup(step.model, step.version_text)
        except DlscaleError as exc:
            raise self._refusal(index, step, f"is not loaded: {exc}") from None
        if version.config.batched and version.config.max_batch_size < self.config.max_batch_size:
            # Triton's rule: a batching step must take every batch the pipeline accepts.
            raise self._refusal(
                index,
                step,
                f"has max_batch_size {version.config.max_batch_size}, below the pipeline's "
                f"{self.config.max_batch_size}",
            )
        return version

    def _check_inputs(
        self,
        index: int,
        step: StepConfig,
        version: StepModel,
        made: dict[str, tuple[Datatype, str]],
    ) -> None:
        inputs = {s.name: s for s in version.inputs}
        unknown = sorted(set(step.input_map) - set(inputs))
        if unknown:
            raise self._refusal(index, step, f"has no inputs {unknown} (it has {sorted(inputs)})")
        unfed = sorted(set(inputs) - set(step.input_map))
        if unfed:
            raise self._refusal(index, step, f"needs inputs {unfed}, which input_map leaves out")
        for name, tensor in step.input_map.items():
            datatype, origin = made[tensor]
            if datatype is not inputs[name].datatype:
                raise self._refusal(
                    index,
                    step,
                    f"takes {inputs[name].datatype.value} as {name!r}, but {origin} "
                    f"({tensor!r}) is {datatype.value}",
                )

    def _specs(self, which: str) -> list[TensorSpec]:
        return self.config.tensor_specs("inputs" if which == "inputs" else "outputs") or []

    def _refusal(self, index: int, step: StepConfig, what: str) -> ConfigError:
        return ConfigError(f"pipeline {self.name!r}, step {index}: model {step.model!r} {what}")

    # -- per request ---------------------------------------------------------------------------

    async def run(self, request: InferenceRequest, serve: Serve) -> dict[str, np.ndarray]:
        """Run every step of a validated request; the pipeline's outputs come back.

        The first step to fail stops the run: steps not started never start, and those waiting
        stop waiting (their batchers drop them). Its error names the step and keeps its class.
        """
        if request.priority > max(self.levels):
            raise InvalidInput(
                f"priority {request.priority} is out of range: the steps of pipeline "
                f"{self.name!r} have priority levels 1..{max(self.levels)} (0 for the default)"
            )
        # When its timeout runs out, in perf_counter nanoseconds (None: no timeout).
        timeout_us = request.timeout_us
        deadline = time.perf_counter_ns() + timeout_us * 1000 if timeout_us else None
        # A region's view may be unmapped once the request is answered, while a cancelled
        # step's batch still reads it: the pipeline keeps its own copy of such inputs.
        inputs = {
            name: np.array(array) if name in request.in_regions else array
            for name, array in request.inputs.items()
        }
        if self.chained:
            return await self._chain(request, inputs, deadline, serve)
        loop = asyncio.get_running_loop()
        tensors: dict[str, asyncio.Future[np.ndarray]] = {}
        for name, array in inputs.items():
            tensors[name] = loop.create_future()
            tensors[name].set_result(array)
        for step in self.steps:
            for tensor in step.output_map.values():
                tensors[tensor] = loop.create_future()
        runs = [
            asyncio.ensure_future(self._step(i, step, request, tensors, deadline, serve))
            for i, step in enumerate(self.steps, 1)
        ]
        try:
            await asyncio.gather(*runs)
        finally:
            for run in runs:
                run.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
        return {name: tensors[name].result() for name in self._answers}

    async def _chain(
        self,
        request: InferenceRequest,
        tensors: dict[str, np.ndarray],
        deadline: int | None,
        serve: Serve,
    ) -> dict[str, np.ndarray]:
        """`run` for a chain: each step in turn, in this task (a failure stops the rest)."""
        for index, step in enumerate(self.steps, 1):
            inputs = {name: tensors[tensor] for name, tensor in step.input_map.items()}
            answer = await self._serve_step(index, step, request, inputs, deadline, serve)
            for name, tensor in step.output_map.items():
                tensors[tensor] = answer.outputs[name]
        return {name: tensors[name] for name in self._answers}

    async def _step(
        self,
        index: int,
        step: StepConfig,
        request: InferenceRequest,
        tensors: dict[str, asyncio.Future[np.ndarray]],
        deadline: int | None,
        serve: Serve,
    ) -> None:
        """Wait for the step's inputs, send it through the DataPlane, publish its outputs."""
        inputs = {name: await tensors[tensor] for name, tensor in step.input_map.items()}
        answer = await self._serve_step(index, step, request, inputs, deadline, serve)
        for name, tensor in step.output_map.items():
            tensors[tensor].set_result(answer.outputs[name])

    async def _serve_step(
        self,
        index: int,
        step: StepConfig,
        request: InferenceRequest,
        inputs: dict[str, np.ndarray],
        deadline: int | None,
        serve: Serve,
    ) -> InferenceResponse:
        """Send one step's request through the DataPlane; its error names the step."""
        # A priority beyond this step's levels is served at its default level, as Triton does.
        priority = request.priority if request.priority <= self.levels[index - 1] else 0
        try:
            return await serve(_step_request(step, request, inputs, priority, deadline))
        except DlscaleError as exc:
            raise self._failure(index, step, exc) from exc

    def _failure(self, index: int, step: StepConfig, exc: DlscaleError) -> DlscaleError:
        """The step's error, of the same class (its HTTP status and gRPC code), naming the step."""
        message = f"in pipeline {self.name!r}, step {index} (model {step.model!r}): {exc}"
        try:
            return type(exc)(message)
        except TypeError:  # an error class with a constructor of its own
            return DlscaleError(message)


def check_nesting(chain: tuple[str, ...]) -> None:
    """Refuse pipelines nested deeper than MAX_NESTING; the error names the chain."""
    if len(chain) > MAX_NESTING:
        shown = " -> ".join(chain if len(chain) <= 8 else (*chain[:4], "...", *chain[-3:]))
        raise ConfigError(
            f"pipeline {chain[0]!r} nests pipelines deeper than the limit of {MAX_NESTING}: {shown}"
        )


def _is_chain(steps: tuple[StepConfig, ...], inputs: set[str]) -> bool:
    """Whether each step needs only the pipeline's inputs (the first) or reads the step just
    before it: then no two steps could ever run at once, and in order is as soon as possible."""
    made: dict[str, int] = {name: 0 for name in inputs}
    for index, step in enumerate(steps, 1):
        sources = {made.get(tensor, -1) for tensor in step.input_map.values()}
        if -1 in sources or index - 1 not in sources:
            return False  # reads what a later step makes, or could start before its previous
        made.update((tensor, index) for tensor in step.output_map.values())
    return True


def _step_request(
    step: StepConfig,
    request: InferenceRequest,
    inputs: dict[str, np.ndarray],
    priority: int,
    deadline: int | None,
) -> InferenceRequest:
    """The step's request: the pipeline request's id, the priority and the remaining timeout."""
    parameters: dict[str, int] = {}
    if priority:
        parameters["priority"] = priority
    if deadline is not None:
        left_us = (deadline - time.perf_counter_ns()) // 1000
        if left_us <= 0:
            raise TimedOut(
                f"the request's timeout ({request.timeout_us} us) ran out before this step "
                "could queue"
            )
        parameters["timeout"] = left_us
    return InferenceRequest(
        step.model,
        inputs,
        model_version=step.version_text,
        id=request.id,
        parameters=dict(parameters),
    )
