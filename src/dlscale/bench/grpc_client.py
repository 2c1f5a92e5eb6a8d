"""An Open Inference Protocol gRPC client: raw tensor contents over one grpc.aio channel.

It sends and reads the same messages (`dlscale.wire`) as the server, so it speaks the published
schema that every OIP server implements. ModelInfer's raw contents stay out of protobuf both ways
(`Framed`): the inputs' memory is joined once into the request's bytes, and outputs are views of
the answer's bytes.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from dlscale.errors import BenchError, InvalidInput
from dlscale.types import InferenceRequest, InferenceResponse
from dlscale.wire.grpc import (
    RAW_INPUT_FIELD,
    RAW_OUTPUT_FIELD,
    Framed,
    decode_infer_response,
    frame_infer_request,
    read_framed,
    serialize,
)
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb
from dlscale.wire.proto.grpc_gen import inference_pb2_grpc

_MAX_MESSAGE = 1 << 30
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


class GrpcClient:
    """One channel to one server's `inference.GRPCInferenceService`."""

    def __init__(self, address: str, timeout_s: float = 60.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._infer: Any = None

    async def open(self) -> None:
        """Open the channel and check that the server is live."""
        self._channel = grpc.aio.insecure_channel(
            self.address,
            options=[
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ],
        )
        stub = inference_pb2_grpc.GRPCInferenceServiceStub
        self._stub = stub(self._channel)  # type: ignore[no-untyped-call]
        self._infer = self._channel.unary_unary(
            _MODEL_INFER, request_serializer=_write_request, response_deserializer=_read_answer
        )
        try:
            reply = await self._call("ServerLive", pb.ServerLiveRequest(), timeout=5.0)
        except BenchError as exc:
            await self.close()
            raise BenchError(f"cannot reach grpc://{self.address}: {exc}; is it running?") from None
        if not reply.live:
            await self.close()
            raise BenchError(f"grpc://{self.address} says it is not live")

    async def close(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = self._infer = None

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's metadata in the REST form: {name, versions, platform, inputs, outputs}."""
        try:
            reply = await self._call(
                "ModelMetadata", pb.ModelMetadataRequest(name=model, version=version)
            )
        except BenchError as exc:
            raise BenchError(
                f"grpc://{self.address} has no ready model {model!r} ({exc})"
            ) from None
        return {
            "name": reply.name,
            "versions": list(reply.versions),
            "platform": reply.platform,
            "inputs": _tensors(reply.inputs),
            "outputs": _tensors(reply.outputs),
        }

    async def model_config(self, model: str, version: str = "") -> dict[str, Any] | None:
        """The model's configuration in the REST form (Triton's field names), or None when the
        server does not offer the extension."""
        reply = await self._optional(
            "ModelConfig", pb.ModelConfigRequest(name=model, version=version)
        )
        return None if reply is None else _as_dict(reply.config)

    async def statistics(self, model: str, version: str = "") -> dict[str, Any] | None:
        """The statistics extension's answer in the REST form, or None when not offered."""
        request = pb.ModelStatisticsRequest(name=model, version=version)
        reply = await self._optional("ModelStatistics", request)
        return None if reply is None else _as_dict(reply)

    async def infer_request(self, request: InferenceRequest) -> InferenceResponse:
        """Run one request as given (inputs or outputs may be in shared-memory regions)."""
        try:
            message = frame_infer_request(request)
        except (InvalidInput, ValueError) as exc:
            raise BenchError(f"grpc://{self.address}: cannot send the inputs: {exc}") from None
        if self._infer is None:
            raise BenchError("the gRPC client is not open")
        try:
            reply = await self._infer(message, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise BenchError(f"{exc.code().name}: {exc.details()}") from None
        placed = {o.name: o.region for o in request.outputs or () if o.region is not None}
        try:
            return decode_infer_response(reply, placed)
        except InvalidInput as exc:
            raise BenchError(f"grpc://{self.address}: the answer cannot be read: {exc}") from None

    async def register_region(self, kind: str, name: str, memory: Any) -> None:
        """Register a region the bench made (shared_memory.HostBuffer or DeviceBuffer)."""
        if kind == "system":
            message: Any = pb.SystemSharedMemoryRegisterRequest(
                name=name, key=memory.key, offset=0, byte_size=memory.byte_size
            )
            await self._call("SystemSharedMemoryRegister", message)
            return
        message = pb.CudaSharedMemoryRegisterRequest(
            name=name,
            raw_handle=memory.handle,
            device_id=memory.device_id,
            byte_size=memory.byte_size,
        )
        await self._call("CudaSharedMemoryRegister", message)

    async def unregister_region(self, kind: str, name: str) -> None:
        """Unregister a region by name."""
        if kind == "system":
            request = pb.SystemSharedMemoryUnregisterRequest(name=name)
            await self._call("SystemSharedMemoryUnregister", request)
        else:
            await self._call(
                "CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name=name)
            )

    async def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        if self._stub is None:
            raise BenchError("the gRPC client is not open")
        try:
            return await getattr(self._stub, method)(request, timeout=timeout or self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise BenchError(f"{exc.code().name}: {exc.details()}") from None

    async def _optional(self, method: str, request: Any) -> Any:
        """The reply of an extension's call, or None when the server does not offer it."""
        try:
            return await self._call(method, request)
        except BenchError:
            return None


def _write_request(message: Framed) -> bytes:
    return serialize(message, RAW_INPUT_FIELD)


def _read_answer(data: bytes) -> Framed:
    return read_framed(data, pb.ModelInferResponse, RAW_OUTPUT_FIELD)


def _tensors(tensors: Any) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]


def _as_dict(message: Any) -> dict[str, Any]:
    # Triton's REST documents use the proto field names; 64-bit counts come back as strings,
    # which every reader here passes through int().
    found: dict[str, Any] = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return found
