"""The stream path of the DataPlane: one request, 0..N responses, from a model that streams.

A model whose backend streams its answers (`Capabilities.streams_answers`: generative engines,
decoupled Python models) has `Seats` instead of a batcher (serving/seats.py). A request is
validated, waits for a seat, and its backend's `stream` is iterated on the event loop; each part
becomes an `InferenceResponse` (`final` on the last). Whoever stops iterating early (a client
that disconnected or cancelled) closes the stream, which closes the backend's iterator at once:
the engine frees the sequence and the seat goes to the next request. A generative model's
tokens are measured here (TTFT, TPOT, token counts), so that every frontend counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, cast

import numpy as np

from dlscale.backends.base import StreamingBackend, StreamPart
from dlscale.backends.generative import contract
from dlscale.errors import BackendError, DlscaleError, InvalidInput
from dlscale.sampling import Sampling
from dlscale.serving.adapters import AdapterRunner, stream_seats
from dlscale.serving.observe.otel import TokenTimes
from dlscale.serving.observe.stats import RequestTimes
from dlscale.serving.observe.tokens import TokenStats
from dlscale.serving.seats import Seats
from dlscale.serving.served import ServedVersion
from dlscale.serving.validation import check
from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire.generative import EXCLUDE_INPUT_IN_OUTPUT, STREAM, lift_optional_inputs

log = logging.getLogger("dlscale.models")


#: Told how a stream ended, for its trace: its times, its tokens' (a generative model's), and
#: whether it was answered in full.
OnEnd = Callable[[RequestTimes, TokenTimes | None, bool], None]


async def open_stream(
    served: ServedVersion, request: InferenceRequest, on_end: OnEnd | None = None
) -> AsyncIterator[InferenceResponse]:
    """The responses to `request` (validated here), as its model's backend sends them; a
    generative request with `stream` false gets one response, its text joined (Triton's vLLM
    backend does the same); `on_end` is told how the stream ended."""
    seats = stream_seats(served.runner)
    if seats is None:
        raise InvalidInput(
            f"model {served.version.name!r} does not stream its answers (it is not decoupled): "
            "ask for one answer (POST .../infer or .../generate, gRPC ModelInfer)"
        )
    if seats.generative:
        request = _lifted(served, request)
        if request.parameters.get(STREAM) is False:
            yield await _joined(served, request, seats, on_end)
            return
        responses = _with_prompt(request, _open(served, request, seats, on_end))
    else:
        responses = _open(served, request, seats, on_end)
    try:
        async for response in responses:
            yield response
    finally:
        await aclose(responses)


def _lifted(served: ServedVersion, request: InferenceRequest) -> InferenceRequest:
    """A generative request with Triton vLLM clients' optional inputs as its parameters."""
    declared = {spec.name for spec in served.inputs}
    try:
        inputs, parameters = lift_optional_inputs(request.inputs, request.parameters, declared)
    except DlscaleError as exc:
        served.stats.record_failure(exc.reason, 0)
        raise
    return replace(request, inputs=inputs, parameters=parameters)


async def _with_prompt(
    request: InferenceRequest, responses: AsyncIterator[InferenceResponse]
) -> AsyncIterator[InferenceResponse]:
    """The responses, the prompt before the first text when `exclude_input_in_output` is
    false (Triton's vLLM clients' way to ask for prompt and completion in one text)."""
    prompt = request.inputs.get(contract.TEXT_INPUT)
    plain = request.parameters.get("input_format", "text") == "text"  # not a chat's JSON
    pending = request.parameters.get(EXCLUDE_INPUT_IN_OUTPUT) is False and plain
    try:
        async for response in responses:
            text = response.outputs.get(contract.TEXT_OUTPUT)
            if pending and text is not None and prompt is not None:
                pending = False
                joined = _as_bytes(prompt) + _as_bytes(text)
                outputs = {**response.outputs, contract.TEXT_OUTPUT: np.array([joined], object)}
                response = replace(response, outputs=outputs)
            yield response
    finally:
        await aclose(responses)


def _as_bytes(array: np.ndarray) -> bytes:
    value = array.reshape(-1)[0]
    return value if isinstance(value, bytes) else str(value).encode()


async def _open(
    served: ServedVersion, request: InferenceRequest, seats: Seats, on_end: OnEnd | None
) -> AsyncIterator[InferenceResponse]:
    """The stream path proper: validated, seated, the backend's parts as responses. An
    adapter's streams are counted by its runner, which waits for them before its weights
    leave the engine."""
    runner = served.runner
    adapter = runner if isinstance(runner, AdapterRunner) else None
    held = adapter.enter() if adapter is not None else None
    times = RequestTimes(request_start=time.perf_counter_ns())
    task = asyncio.current_task()
    assert task is not None  # an async generator is iterated by a task
    seats.tasks.add(task)  # ended at the shutdown's cut (Seats.cut) if still running then
    try:
        wanted = set(check(served, request)[0])
        # Read once, and refused before it waits: the engine is given it typed.
        key = adapter.key if adapter is not None else ""
        sampling = _sampling(request, key) if seats.generative else None
        instance = await seats.enter(request.priority, request.timeout_us, times)
    except BaseException as exc:  # refused, or its client left (or the cut came) while it waited
        reason = exc.reason if isinstance(exc, DlscaleError) else "CANCELED"
        served.stats.record_failure(reason, _ended(times, on_end))
        seats.tasks.discard(task)
        if adapter is not None:
            adapter.leave(held)
        raise
    times.compute_start = times.compute_input_end = time.perf_counter_ns()
    backend = cast(StreamingBackend, instance.backend)
    meter = _Meter(seats.tokens if backend.capabilities.generates_text else None, times)
    parts = _parts(backend, request, sampling)
    outcome = "CANCELED"  # unless the stream ends or fails: its client left
    try:
        async for part in parts:
            meter.saw(part)
            if part.final:  # answered in full, even if its caller closes once it has it
                outcome = ""
            yield _response(served, request, part, wanted)
            if part.final:
                break
        else:  # the backend ended without a final part: a flag alone ends the stream
            outcome = ""
            yield _response(served, request, StreamPart({}, final=True), wanted)
    except DlscaleError as exc:
        outcome = exc.reason
        raise
    except Exception as exc:  # a backend bug ends its stream, not the server
        log.exception("model %s failed a stream", served.version.name)
        outcome = BackendError.reason
        raise BackendError(f"model {served.version.name!r} failed: {exc!r}") from exc
    finally:
        with contextlib.suppress(Exception):
            await aclose(parts)  # frees the engine's sequence at once
        seats.leave(instance)
        seats.tasks.discard(task)
        times.compute_output_start = times.compute_end = times.request_end = time.perf_counter_ns()
        meter.done(times, outcome)
        if on_end is not None:
            on_end(times, meter.token_times(), not outcome)
        if outcome:
            served.stats.record_failure(outcome, times.request_end - times.request_start)
        else:
            served.stats.record_success(times, 1)
        if adapter is not None:
            adapter.leave(held)


def _sampling(request: InferenceRequest, adapter: str) -> Sampling:
    """The request's generation settings: as its frontend typed them, or read from its
    parameters (the one place an OIP request's settings are read); the adapter is the model's
    the request named, whatever the request says."""
    sampling = request.sampling or Sampling.from_parameters(request.parameters)
    return replace(sampling, adapter=adapter) if adapter or sampling.adapter else sampling


def _parts(
    backend: StreamingBackend, request: InferenceRequest, sampling: Sampling | None
) -> AsyncIterator[StreamPart]:
    """The backend's parts: an engine takes the settings typed; a Python model (Triton's
    contract) reads its parameters, so the typed settings are written back into them."""
    if sampling is not None and isinstance(backend, contract.GenerativeBackend):
        return backend.generate(request.id, request.inputs, sampling)
    parameters = request.parameters
    if request.sampling is not None:
        parameters = {**parameters, **request.sampling.as_parameters()}
    return backend.stream(request.id, request.inputs, parameters)


async def joined(
    served: ServedVersion, request: InferenceRequest, on_end: OnEnd | None = None
) -> InferenceResponse:
    """One answer from a generative model's stream (its text joined), for a unary request;
    a decoupled model that is not generative answers none (as Triton)."""
    seats = stream_seats(served.runner)
    if seats is None or not seats.generative:
        served.stats.record_failure(InvalidInput.reason, 0)
        raise InvalidInput(
            f"model {served.version.name!r} is decoupled (it streams 0..N answers per request): "
            "ask gRPC ModelStreamInfer or POST .../generate_stream, not ModelInfer or .../infer"
        )
    return await _joined(served, _lifted(served, request), seats, on_end)


async def _joined(
    served: ServedVersion, request: InferenceRequest, seats: Seats, on_end: OnEnd | None
) -> InferenceResponse:
    whole = replace(request, outputs=None)  # join reads the counts, asked for or not
    stream = _with_prompt(whole, _open(served, whole, seats, on_end))
    try:
        responses = [r async for r in stream]
    finally:
        await aclose(stream)
    part = contract.join(StreamPart(r.outputs, r.parameters, r.final) for r in responses)
    names = {o.name for o in request.outputs} if request.outputs is not None else None
    outputs = {n: a for n, a in part.outputs.items() if names is None or n in names}
    return InferenceResponse(
        request.model_name, outputs, str(served.version.version), request.id, part.parameters
    )


async def aclose(iterator: AsyncIterator[Any]) -> None:
    """Close an async iterator that has `aclose` (an async generator's runs its cleanup)."""
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()


def _response(
    served: ServedVersion, request: InferenceRequest, part: StreamPart, wanted: set[str]
) -> InferenceResponse:
    return InferenceResponse(
        model_name=request.model_name,
        model_version=str(served.version.version),
        id=request.id,
        outputs={n: a for n, a in part.outputs.items() if n in wanted},
        parameters=dict(part.parameters),
        final=part.final,
    )


class _Meter:
    """A generative request's token times and counts, handed to its model's TokenStats."""

    def __init__(self, tokens: TokenStats | None, times: RequestTimes) -> None:
        self.tokens = tokens
        self.start = times.request_start
        self.first = 0  # when the first token came (perf_counter ns)
        self.last = 0
        self.prompt = 0
        self.generated = 0
        self.reason = ""  # the engine's finish reason, on the last part

    def saw(self, part: StreamPart) -> None:
        if self.tokens is None:
            return
        outputs = part.outputs
        before = self.generated
        if contract.NUM_OUTPUT_TOKENS in outputs:
            self.generated = int(outputs[contract.NUM_OUTPUT_TOKENS].reshape(-1)[0])
        if contract.NUM_INPUT_TOKENS in outputs:
            self.prompt = int(outputs[contract.NUM_INPUT_TOKENS].reshape(-1)[0])
        if contract.FINISH_REASON in outputs:
            self.reason = _as_bytes(outputs[contract.FINISH_REASON]).decode()
        if self.generated <= before:
            return
        now = time.perf_counter_ns()
        if not self.first:
            self.first = now
            self.tokens.ttft.observe((self.first - self.start) / 1e9)
        else:  # a part may carry several tokens: each waited its share of the gap
            count = self.generated - before
            self.tokens.inter_token.observe((now - self.last) / 1e9 / count, count)
        self.last = now

    def token_times(self) -> TokenTimes | None:
        """When the first and last tokens came (None: not a generative model)."""
        return None if self.tokens is None else TokenTimes(self.first, self.last)

    def done(self, times: RequestTimes, outcome: str) -> None:
        """The request ended: `outcome` "" when answered in full, else Triton's reason."""
        tokens = self.tokens
        if tokens is None:
            return
        tokens.prompt_tokens += self.prompt
        tokens.generated_tokens += self.generated
        if self.generated > 1:  # TPOT: from the first token to the last, per later token
            tokens.tpot.observe((self.last - self.first) / 1e9 / (self.generated - 1))
        if outcome == "CANCELED":  # its client left: vLLM counts it as aborted
            tokens.finished_by["abort"] += 1
        if outcome:
            return
        tokens.finished_by[self.reason or "stop"] += 1
        end = times.request_end
        seated = times.compute_start or end
        first = self.first or end
        last = self.last or first
        # Its phases: waiting for a seat, to its first token, to its last, in all.
        tokens.queue.observe((seated - times.queue_start) / 1e9)
        tokens.prefill.observe((first - seated) / 1e9)
        tokens.decode.observe((last - first) / 1e9)
        tokens.end_to_end.observe((end - times.request_start) / 1e9)


def _ended(times: RequestTimes, on_end: OnEnd | None) -> int:
    """A stream refused or left before its seat: its time in the server (its trace told)."""
    times.request_end = time.perf_counter_ns()
    if on_end is not None:
        on_end(times, None, False)
    return times.request_end - times.request_start
