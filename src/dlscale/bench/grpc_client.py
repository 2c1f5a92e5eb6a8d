"""An Open Inference Protocol gRPC client: raw tensor contents over one grpc.aio channel."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from dlscale.bench import oip_proto as pb
from dlscale.bench.tensors import datatype_of, from_list, from_raw, to_raw
from dlscale.errors import BenchError

_MAX_MESSAGE = 1 << 30

# Typed `contents` fields by datatype, for servers that answer without raw contents.
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


class GrpcClient:
    """One channel to one server's `inference.GRPCInferenceService`."""

    def __init__(self, address: str, timeout_s: float = 60.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._calls: dict[str, Any] = {}

    async def open(self) -> None:
        """Open the channel and check that the server is live."""
        self._channel = grpc.aio.insecure_channel(
            self.address,
            options=[
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ],
        )
        for method, request, response in (
            ("ServerLive", pb.ServerLiveRequest, pb.ServerLiveResponse),
            ("ModelMetadata", pb.ModelMetadataRequest, pb.ModelMetadataResponse),
            ("ModelInfer", pb.ModelInferRequest, pb.ModelInferResponse),
        ):
            self._calls[method] = self._channel.unary_unary(
                f"/{pb.SERVICE}/{method}",
                request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
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
        request = pb.ModelInferRequest(model_name=model, model_version=version)
        for name, arr in inputs.items():
            request.inputs.add(name=name, datatype=datatype_of(arr), shape=list(arr.shape))
            request.raw_input_contents.append(to_raw(arr))
        reply = await self._call("ModelInfer", request)
        raw = list(reply.raw_output_contents)
        outputs = {}
        for i, out in enumerate(reply.outputs):
            if raw:
                outputs[out.name] = from_raw(raw[i], out.datatype, out.shape)
            else:
                field = _CONTENTS.get(out.datatype)
                if field is None:
                    raise BenchError(f"output {out.name!r}: {out.datatype} needs raw contents")
                values = list(getattr(out.contents, field))
                outputs[out.name] = from_list(values, out.datatype, out.shape)
        return outputs

    async def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        if self._channel is None:
            raise BenchError("the gRPC client is not open")
        try:
            return await self._calls[method](request, timeout=timeout or self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise BenchError(f"{exc.code().name}: {exc.details()}") from None


def _tensors(tensors: Any) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in tensors]
