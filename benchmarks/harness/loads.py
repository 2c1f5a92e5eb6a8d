"""The loads the scripts drive: one closed-loop run against a started server, and in process.

`rest_load` is the REST benchmark's run (JSON or binary bodies); `drive` one of the large-tensor
loads (`LOADS`: 19 MB and [1, 16] over REST and gRPC); `inprocess_throughput` a bare onnxruntime
session, the ceiling a server of the same model can reach.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import uvloop

from benchmarks.harness.clients import LoadResult, build_request, closed_loop
from benchmarks.harness.grpc_clients import decode_output, grpc_closed_loop, infer_request
from benchmarks.harness.models import LARGE, SMALL, BenchModel
from benchmarks.harness.servers import HOST, ServerProcess

#: (label, protocol, model, rows per request, requests in flight)
Load = tuple[str, str, BenchModel, int, int]
LOADS: list[Load] = [
    ("rest 19 MB", "rest", LARGE, 32, 4),
    ("grpc 19 MB", "grpc", LARGE, 32, 4),
    ("rest [1,16]", "rest", SMALL, 1, 32),
    ("grpc [1,16]", "grpc", SMALL, 1, 32),
]


def rest_load(
    server: ServerProcess, model: BenchModel, binary: bool, concurrency: int, duration: float
) -> LoadResult:
    """One closed-loop run against `server`."""
    path = f"/v2/models/{model.name}/infer"
    if binary:
        body, headers = model.binary_body()
        wire = build_request(HOST, server.port, path, body, headers)
    else:
        wire = build_request(HOST, server.port, path, model.json_body())
    result = uvloop.run(
        closed_loop(
            HOST,
            server.port,
            wire,
            concurrency,
            duration,
            warmup_s=min(max(2.0, duration / 10), duration / 2),
        )
    )
    if result.errors:
        print(f"  {server.name}: {result.errors} errors, first: {result.first_error}", flush=True)
    return result


def drive(
    protocol: str, model: BenchModel, rows: int, c: int, ports: tuple[int, int], duration: float
) -> LoadResult:
    """One closed-loop run; the first gRPC answer is checked against the input."""
    http, grpc_port = ports
    warmup = 1.0
    if protocol == "grpc":
        request, x = infer_request(model, rows)
        target = f"{HOST}:{grpc_port}"
        result, first = asyncio.run(grpc_closed_loop(target, request, c, duration, warmup))
        if first and not np.array_equal(decode_output(first, model.output_name), x):
            raise RuntimeError(f"{model.name} over gRPC answered other values")
        return result
    body, headers = model.binary_body(rows)
    wire = build_request(HOST, http, f"/v2/models/{model.name}/infer", body, headers)
    return uvloop.run(closed_loop(HOST, http, wire, c, duration, warmup))


def inprocess_throughput(path: Path, model: BenchModel, batch: int, duration: float) -> float:
    """Rows per second of a bare onnxruntime session at `batch`, same session options as served."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = model.intra_op_threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = model.rows(batch)
    session.run(None, {model.input_name: x})
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        session.run(None, {model.input_name: x})
        runs += 1
    return runs * batch / (time.perf_counter() - start)
