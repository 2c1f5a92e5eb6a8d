"""A closed-loop gRPC load client: N streams, one channel each, one ModelInfer at a time.

Every gRPC server is measured with this same client. The request is serialized once (with
dlscale's wire codec, the published schema, raw contents); responses are read as bytes, and the
first one of each run is decoded and checked, so that the client spends its time on the wire, not
on protobuf.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np

from benchmarks.harness.clients import LoadResult
from benchmarks.harness.models import BenchModel
from dlscale.types import InferenceRequest
from dlscale.wire.grpc import decode_infer_response, encode_infer_request
from dlscale.wire.proto.grpc_gen import inference_pb2

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def infer_request(model: BenchModel, rows: int = 1) -> tuple[bytes, np.ndarray]:
    """A serialized ModelInferRequest with the input as raw contents, and that input."""
    x = model.rows(rows)
    request = encode_infer_request(InferenceRequest(model.name, {model.input_name: x}))
    return request.SerializeToString(), x


def decode_output(answer: bytes, name: str) -> np.ndarray:
    """One output of a serialized ModelInferResponse, raw or typed."""
    outputs = decode_infer_response(inference_pb2.ModelInferResponse.FromString(answer)).outputs
    if name not in outputs:
        raise ValueError(f"no output {name!r} in the response")
    return outputs[name]


async def grpc_closed_loop(
    target: str,
    request: bytes,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 1.0,
) -> tuple[LoadResult, bytes]:
    """Run `concurrency` streams for warm-up plus `duration_s`; measure only after warm-up.

    Returns the measurements and the first successful response (for the caller to check).
    """
    result = LoadResult(concurrency, duration_s)
    first: list[bytes] = []
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s

    async def stream() -> None:
        # One connection per stream, as the HTTP client does (no shared subchannel pool).
        options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            call = channel.unary_unary(METHOD)  # bytes in, bytes out: no client-side protobuf
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                try:
                    answer = await call(request)
                except grpc.aio.AioRpcError as exc:
                    result.errors += 1
                    result.first_error = result.first_error or f"{exc.code()}: {exc.details()}"
                    return  # a server that fails once is reported, not hammered
                t1 = time.perf_counter()
                if not first:
                    first.append(answer)
                if t0 >= measure_from:
                    result.latencies_s.append(t1 - t0)

    await asyncio.gather(*(stream() for _ in range(concurrency)))
    return result, first[0] if first else b""
