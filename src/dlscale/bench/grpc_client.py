"""An Open Inference Protocol gRPC client: raw tensor contents over one grpc.aio channel.

It sends and reads the same messages (`dlscale.wire`) as the server, so it speaks the published
schema that every OIP server implements.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from dlscale.errors import BenchError, InvalidInput
from dlscale.types import InferenceRequest
from dlscale.wire.grpc import decode_infer_response, encode_infer_request
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb
from dlscale.wire.proto.grpc_gen import inference_pb2_grpc

_MAX_MESSAGE = 1 << 30


class GrpcClient:
    """One channel to one server's `inference.GRPCInferenceService`."""

    def __init__(self, address: str, timeout_s: float = 60.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

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
            self._stub = None

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

    async def infer(
        self, model: str, inputs: dict[str, np.ndarray], version: str = ""
    ) -> dict[str, np.ndarray]:
        """Run one request with raw input contents and return every output."""
        try:
            request = encode_infer_request(InferenceRequest(model, inputs, model_version=version))
        except (InvalidInput, ValueError) as exc:
            raise BenchError(f"grpc://{self.address}: cannot send the inputs: {exc}") from None
        reply = await self._call("ModelInfer", request)
        try:
            return decode_infer_response(reply).outputs
        except InvalidInput as exc:
            raise BenchError(f"grpc://{self.address}: the answer cannot be read: {exc}") from None

    async def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        if self._stub is None:
            raise BenchError("the gRPC client is not open")
        try:
            return await getattr(self._stub, method)(request, timeout=timeout or self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise BenchError(f"{exc.code().name}: {exc.details()}") from None


def _tensors(tensors: Any) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]
