"""The GRPCInferenceService servicer: decode (wire codec), one DataPlane call, encode (convert)."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from dlscale.errors import DlscaleError, redact_paths
from dlscale.frontends.grpc import convert
from dlscale.frontends.grpc.outbox import Outbox
from dlscale.frontends.limits import Limits
from dlscale.frontends.offload import OFF_LOOP_BYTES, off_loop
from dlscale.frontends.plane import Asked, Plane
from dlscale.serving.observe.logs import access, log_failure
from dlscale.serving.observe.otel import TRACEPARENT
from dlscale.serving.regions.registry import RegionKind
from dlscale.serving.streams import aclose
from dlscale.types import InferenceRequest
from dlscale.wire.documents import statistics_message
from dlscale.wire.grpc import Framed, decode_infer_request, frame_infer_response, wants_raw
from dlscale.wire.proto.grpc_gen import inference_pb2_grpc

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_Handler = Callable[[Any, Any, Any], Awaitable[_T]]
#: Triton's response parameter on each ModelStreamInfer response: whether it is the last.
FINAL = "triton_final_response"
#: The request parameter that asks for a final response even when it carries no outputs.
EMPTY_FINAL = "triton_enable_empty_final_response"


def unary(handler: _Handler[_T]) -> _Handler[_T]:
    """Map the error tree to gRPC status codes; anything else is INTERNAL and logged (the
    TensorFlow Serving servicers' too, tfserving_rpcs.py)."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: Any, context: Any) -> _T:
        start = time.perf_counter()
        code = "OK"
        try:
            return await handler(self, request, context)
        except Exception as exc:
            code = _code_of(exc)
            await _abort(exc, handler.__name__, request, context)
        finally:
            _access_line(handler.__name__, request, code, start)
        raise AssertionError("context.abort returned")  # abort always raises

    return wrapped


def _code_of(exc: Exception) -> str:
    return exc.grpc_code if isinstance(exc, DlscaleError) else "INTERNAL"


async def _abort(exc: Exception, method: str, request: Any, context: Any) -> None:
    """End the call with `exc`'s status: the error tree's code, anything else INTERNAL (logged).
    Raises, as `context.abort` does."""
    if isinstance(exc, DlscaleError):
        log_failure("gRPC", _model_of(request), exc.grpc_code, exc.reason, f"{method}: {exc}")
        await context.abort(grpc.StatusCode[exc.grpc_code], exc.message)
    log.exception("gRPC %s failed", method)
    await context.abort(grpc.StatusCode.INTERNAL, redact_paths(f"internal error: {exc!r}"))


def _access_line(method: str, request: Any, code: str, start: float) -> None:
    if access.isEnabledFor(logging.INFO):
        elapsed_ms = (time.perf_counter() - start) * 1000
        access.info("gRPC %s %s %s %.3fms", method, _model_of(request), code, elapsed_ms)


def _model_of(request: Any) -> str:
    """The model a request is about, whichever field names it."""
    spec = getattr(request, "model_spec", None)  # TensorFlow Serving's requests
    for field in ("model_name", "name"):
        value = getattr(request if spec is None else spec, field, "")
        if isinstance(value, str) and value:
            return value
    return ""


class InferenceServicer(inference_pb2_grpc.GRPCInferenceServiceServicer):
    """Every RPC of the service over one DataPlane; no scheduling or validation here."""

    def __init__(self, dataplane: Plane, limits: Limits) -> None:
        self.dataplane = Asked(dataplane)
        self.max_message_bytes = limits.max_grpc_message_bytes
        self.max_elements = limits.max_tensor_elements
        #: Requests of one ModelStreamInfer stream in flight, and its answers waiting for its
        #: client to read them (frontends/limits.py).
        self.max_stream_requests = limits.max_stream_requests
        self.max_stream_answers = limits.max_stream_answers
        #: The outbox of each stream open now: what the server holds for each (its own count).
        self.outboxes: set[Outbox] = set()
        self.shared_memory = dataplane.shared_memory
        #: Whether a caller's `traceparent` metadata is read: only an OTLP trace continues it,
        #: and whether the server has one is fixed at its start (`GrpcFrontend.start` says).
        self.continues_traces = True

    # -- health and metadata ------------------------------------------------------------------

    @unary
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return convert.response("ServerLive", live=await self.dataplane.live())

    @unary
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return convert.response("ServerReady", ready=await self.dataplane.ready())

    @unary
    async def ModelReady(self, request: Any, context: Any) -> Any:
        ready = await self.dataplane.model_ready(request.name, request.version)
        return convert.response("ModelReady", ready=ready)

    @unary
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return convert.server_metadata(await self.dataplane.server_metadata())

    @unary
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return convert.model_metadata(
            await self.dataplane.model_metadata(request.name, request.version)
        )

    @unary
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        return convert.model_config(
            await self.dataplane.model_config(request.name, request.version)
        )

    # -- inference ------------------------------------------------------------------------------

    async def ModelInfer(self, request: Any, context: Any) -> Framed:
        """One coroutine per call, `unary`'s error mapping inline: this runs for every request,
        and each coroutine layer costs it a frame on every resumption."""
        start = time.perf_counter()
        code = "OK"
        try:
            traceparent = _traceparent(context) if self.continues_traces else ""
            decoded = self._decoded(request, traceparent)
            if decoded is None:
                decoded = await self._decoded_off_loop(request, traceparent)
            response = await self.dataplane.infer(decoded)
            return frame_infer_response(response, wants_raw(decoded), self.max_message_bytes)
        except Exception as exc:
            code = _code_of(exc)
            await _abort(exc, "ModelInfer", request, context)
        finally:
            _access_line("ModelInfer", request, code, start)
        raise AssertionError("context.abort returned")  # abort always raises

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        """Answer each request of the stream as it completes: 0..N responses for a model that
        streams (Triton's decoupled models), one for any other; errors travel in-stream."""
        outbox = Outbox(self.max_stream_answers)
        running: set[asyncio.Task[None]] = set()
        # One stream may carry any number of requests: past this many in flight, or while its
        # answers wait at their bound, it is not read further, so that a client cannot make the
        # server hold more than that for it.
        room = asyncio.Semaphore(self.max_stream_requests)
        traceparent = _traceparent(context)  # the stream's; each request continues it

        async def answer(message: Any) -> None:
            try:
                await self._answer_stream(message, outbox.put, traceparent)
            except DlscaleError as exc:
                log_failure("gRPC", _plain(message).model_name, exc.grpc_code, exc.reason, str(exc))
                await outbox.put(convert.stream_error(exc.message, _plain(message)))
            except Exception as exc:
                log.exception("gRPC ModelStreamInfer request failed")
                text = redact_paths(f"internal error: {exc!r}")
                await outbox.put(convert.stream_error(text, _plain(message)))
            finally:
                room.release()

        async def read() -> None:
            # Requests run concurrently, so that those of one stream can share a batch.
            try:
                while True:
                    await room.acquire()
                    await outbox.wait_room()
                    message = await anext(requests, None)
                    if message is None:
                        room.release()
                        break
                    task = asyncio.create_task(answer(message))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.gather(*running)
            finally:
                outbox.end()  # also when reading fails: the stream then ends with it

        reader = asyncio.create_task(read())
        self.outboxes.add(outbox)
        try:
            while (reply := await outbox.get()) is not None:
                yield reply
            await reader  # re-raises a failure of the request stream itself
        finally:
            # The client left or cancelled, or was cut for not reading: each request's stream
            # is closed, its sequence freed.
            self.outboxes.discard(outbox)
            for task in (reader, *running):
                task.cancel()

    async def _answer_stream(
        self, message: Any, send: Callable[[Any], Awaitable[None]], traceparent: str = ""
    ) -> None:
        """One request of ModelStreamInfer: each response flagged `triton_final_response`; a
        final response with no outputs only if the request sets
        `triton_enable_empty_final_response` (Triton's decoupled protocol)."""
        plain = _plain(message)
        config = await self.dataplane.model_config(plain.model_name, plain.model_version)
        request = self._decoded(message, traceparent)
        if request is None:
            request = await self._decoded_off_loop(message, traceparent)
        raw = wants_raw(request)
        if not config.decoupled:
            response = await self.dataplane.infer(request)
            reply = frame_infer_response(response, raw, self.max_message_bytes)
            reply.message.parameters[FINAL].bool_param = True
            await send(reply)
            return
        empty_final = request.parameters.get(EMPTY_FINAL) is True
        responses = self.dataplane.stream(request)
        try:
            async for response in responses:
                if response.final and not response.outputs and not empty_final:
                    continue
                response.parameters[FINAL] = response.final
                await send(frame_infer_response(response, raw, self.max_message_bytes))
        finally:
            await aclose(responses)

    def _decoded(self, message: Any, traceparent: str) -> InferenceRequest | None:
        """The request decoded here, or None when it is large enough to decode off the loop
        (most messages are decoded here, without a coroutine for `off_loop`)."""
        plain = _plain(message)  # a model over its [qos] limits refuses before tensors are read
        refusal = self.dataplane.refuse_early(plain.model_name, plain.model_version)
        if refusal is not None:
            raise refusal
        if _large(message):
            return None
        request = decode_infer_request(message, self.max_elements)
        request.traceparent = traceparent
        return request

    async def _decoded_off_loop(self, message: Any, traceparent: str) -> InferenceRequest:
        request = await off_loop(True, decode_infer_request, message, self.max_elements)
        request.traceparent = traceparent
        return request

    # -- statistics and repository ----------------------------------------------------------------

    @unary
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        return statistics_message(await self.dataplane.statistics(request.name, request.version))

    @unary
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        return convert.repository_index(await self.dataplane.repository_index(request.ready))

    @unary
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        parameters = convert.load_parameters(request)
        await self.dataplane.load_model(request.model_name, parameters)
        return convert.response("RepositoryModelLoad")

    @unary
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        await self.dataplane.unload_model(request.model_name)
        return convert.response("RepositoryModelUnload")

    # -- trace and log settings -------------------------------------------------------------------

    @unary
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        model, changes = convert.trace_changes(request)
        return convert.trace_settings(await self.dataplane.trace_settings(model, changes))

    @unary
    async def LogSettings(self, request: Any, context: Any) -> Any:
        changes = convert.log_changes(request)
        return convert.log_settings(await self.dataplane.log_settings(changes))

    # -- shared memory (Triton's system and CUDA extensions; the registry does the work) --------

    @unary
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return convert.regions(
            RegionKind.SYSTEM, self.shared_memory.status(RegionKind.SYSTEM, request.name)
        )

    @unary
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self.shared_memory.register_system(
            request.name, request.key, request.offset, request.byte_size
        )
        return convert.response("SystemSharedMemoryRegister")

    @unary
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self.shared_memory.unregister(RegionKind.SYSTEM, request.name)  # no name: every region
        return convert.response("SystemSharedMemoryUnregister")

    @unary
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return convert.regions(
            RegionKind.CUDA, self.shared_memory.status(RegionKind.CUDA, request.name)
        )

    @unary
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self.shared_memory.register_cuda(
            request.name, bytes(request.raw_handle), request.device_id, request.byte_size
        )
        return convert.response("CudaSharedMemoryRegister")

    @unary
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self.shared_memory.unregister(RegionKind.CUDA, request.name)  # no name: every region
        return convert.response("CudaSharedMemoryUnregister")


def _large(message: Any) -> bool:
    """Whether a ModelInferRequest (`Framed`, or whole: a small one, or on Ray Serve's proxy)
    carries or declares enough to decode it off the loop."""
    if isinstance(message, Framed):
        blobs, inputs = message.raw, message.message.inputs
    else:
        blobs, inputs = message.raw_input_contents, message.inputs
    # Loops, not generators in `sum`: this runs for every request.
    raw = declared = 0
    for blob in blobs:
        raw += len(blob)
    for tensor in inputs:
        declared += math.prod(tensor.shape[:])  # a slice: iterating the field itself is slower
    return raw > OFF_LOOP_BYTES or declared * 4 > OFF_LOOP_BYTES


def _plain(message: Any) -> Any:
    """The ModelInferRequest itself, whether its raw contents travel beside it or inside."""
    return message.message if isinstance(message, Framed) else message


def _traceparent(context: Any) -> str:
    """The caller's W3C `traceparent` metadata ("" when none), continued by an OTLP trace."""
    for key, value in context.invocation_metadata() or ():
        if key == TRACEPARENT:
            return str(value)
    return ""
