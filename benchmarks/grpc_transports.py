"""Which grpcio server carries ModelInfer fastest from Python: the transport alone, no model.

    python -m benchmarks.grpc_transports [--repeats 3] [--duration 4] [--transports aio ...]
    python -m benchmarks.grpc_transports serve TRANSPORT [--port P]   # prints LISTENING <port>

Each transport serves ModelInfer with the same work a gRPC frontend does per call besides the
model: the request read as raw contents beside protobuf (wire/grpc.py `read_framed`) and an
answer carrying the same bytes back (`serialize`), so what is compared is the transport's own
cost. Transports: `aio` (grpc.aio, as `dlscale serve` runs today), `sync-T` (grpcio's
synchronous server, a pool of T threads), and `aio-xN` (N aio processes sharing the port with
SO_REUSEPORT, the kernel spreading connections). Loads: a [1, 16] FP32 request at 32 in flight,
and a 19 MB one ([32, 3, 224, 224]) at 4 in flight, with benchmarks/harness/grpc_clients.py.
Then the same with the model: `dlscale-aio` (dlscale's gRPC frontend) against `dlscale-sync-T`
(a sketch of dlscale's ModelInfer behind the synchronous server, `serve_dlscale_sync`). Transports
alternate within each repetition and the table gives medians of requests/s and of the server
processes' CPU time per request (/proc), the figure that does not depend on how fast the client
on the same cores is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from benchmarks.harness.grpc_clients import grpc_closed_loop, infer_request
from benchmarks.harness.models import LARGE, SMALL, build_large_repository
from benchmarks.harness.servers import (
    HOST,
    RESULTS,
    WORK,
    ServerProcess,
    announce,
    cpu_seconds,
    free_port,
    start_listening,
)
from benchmarks.harness.statistics import machine, record
from dlscale.wire.grpc import RAW_INPUT_FIELD, RAW_OUTPUT_FIELD, Framed, read_framed, serialize
from dlscale.wire.proto.grpc_gen import inference_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
LIMIT = 64 << 20  # dlscale's default message limit, each way
OPTIONS = [("grpc.max_receive_message_length", LIMIT), ("grpc.max_send_message_length", LIMIT)]
TRANSPORTS = ["aio", "sync-4", "sync-16", "aio-x2", "dlscale-aio", "dlscale-sync-4"]
#: (label, model, rows per request, requests in flight)
WARMUP = 1.0
LOADS = [("[1,16] c=32", SMALL, 1, 32), ("19 MB c=4", LARGE, 32, 4)]


def _read(data: bytes) -> Framed:
    return read_framed(data, pb.ModelInferRequest, RAW_INPUT_FIELD)


def _answer(request: Framed) -> Framed:
    """The request's tensors back as outputs, raw contents untouched (an identity model)."""
    answer = pb.ModelInferResponse(model_name=request.message.model_name)
    for tensor in request.message.inputs:
        answer.outputs.add(name="output", datatype=tensor.datatype, shape=tensor.shape)
    return Framed(answer, list(request.raw))


def _write(answer: Framed) -> bytes:
    return serialize(answer, RAW_OUTPUT_FIELD)


def _handlers(infer: Any) -> Any:
    handler = grpc.unary_unary_rpc_method_handler(
        infer, request_deserializer=_read, response_serializer=_write
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"ModelInfer": handler})


async def serve_aio(port: int, reuse_port: bool) -> None:
    """grpc.aio with an async handler, as the gRPC frontend runs."""

    async def infer(request: Framed, context: Any) -> Framed:
        return _answer(request)

    server = grpc.aio.server(options=[*OPTIONS, ("grpc.so_reuseport", int(reuse_port))])
    server.add_generic_rpc_handlers((_handlers(infer),))
    bound = server.add_insecure_port(f"{HOST}:{port}")
    await server.start()
    announce(bound)
    await server.wait_for_termination()


def serve_sync(port: int, threads: int) -> None:
    """grpcio's synchronous server, `threads` handler threads."""

    def infer(request: Framed, context: Any) -> Framed:
        return _answer(request)

    server = grpc.server(futures.ThreadPoolExecutor(threads), options=OPTIONS)
    server.add_generic_rpc_handlers((_handlers(infer),))
    bound = server.add_insecure_port(f"{HOST}:{port}")
    server.start()
    announce(bound)
    server.wait_for_termination()


def serve_dlscale_sync(port: int, threads: int, repo: Path) -> None:
    """A sketch of dlscale behind grpcio's synchronous server: ModelInfer only, no error mapping.

    Decoding and encoding run in the handler's thread; the request crosses to the serving
    core's event loop (a ServerThread with no frontend) and back once per call.
    """
    from dlscale.server import ServerSettings, ServerThread
    from dlscale.wire.grpc import decode_infer_request, frame_infer_response, wants_raw

    settings = ServerSettings.build(
        repo, host=HOST, http_port=None, grpc_port=None, metrics_port=None
    )
    core = ServerThread(settings)
    core.start()

    def infer(framed: Framed, context: Any) -> Framed:
        request = decode_infer_request(framed)
        response = core.run(core.server.dataplane.infer(request))
        return frame_infer_response(response, wants_raw(request), LIMIT)

    server = grpc.server(futures.ThreadPoolExecutor(threads), options=OPTIONS)
    server.add_generic_rpc_handlers((_handlers(infer),))
    bound = server.add_insecure_port(f"{HOST}:{port}")
    server.start()
    announce(bound)
    server.wait_for_termination()


def start(transport: str) -> list[ServerProcess]:
    """The processes serving one transport (several for aio-xN, on one port)."""
    repo = str(WORK / "large-repo")
    if transport == "dlscale-aio":  # the gRPC frontend as `dlscale serve` runs it
        return [start_listening(transport, ["-m", "benchmarks.serve_grpc", "serve", repo])]
    if transport.startswith("dlscale-sync-"):
        argv = ["-m", "benchmarks.grpc_transports", "serve", transport, "--repo", repo]
        return [start_listening(transport, argv)]
    if transport.startswith("aio-x"):
        port = free_port()
        argv = ["-m", "benchmarks.grpc_transports", "serve", "aio", "--port", str(port)]
        count = int(transport.removeprefix("aio-x"))
        return [start_listening(transport, [*argv, "--reuse-port"]) for _ in range(count)]
    return [start_listening(transport, ["-m", "benchmarks.grpc_transports", "serve", transport])]


def _cpu(servers: list[ServerProcess]) -> float:
    return sum(cpu_seconds(server.proc.pid) for server in servers)


def run(repeats: int, duration: float, transports: list[str]) -> list[dict[str, Any]]:
    """Every (load, transport), transports alternating within each repetition."""
    build_large_repository(WORK / "large-repo")
    rows: list[dict[str, Any]] = []
    requests = {label: infer_request(model, n)[0] for label, model, n, _ in LOADS}
    for rep in range(repeats):
        for transport in transports if rep % 2 == 0 else transports[::-1]:
            servers = start(transport)
            try:
                for label, _, _, c in LOADS:
                    target = f"{HOST}:{servers[0].port}"
                    cpu = _cpu(servers)
                    result, first = asyncio.run(
                        grpc_closed_loop(target, requests[label], c, duration, WARMUP)
                    )
                    cpu = _cpu(servers) - cpu
                    if len(first) < len(requests[label]) - 64:  # the payload came back
                        raise RuntimeError(f"{transport} answered {len(first)} bytes")
                    # CPU over warm-up and window, per request at the window's rate.
                    ms = cpu / (result.throughput * (duration + WARMUP)) * 1e3
                    record(rows, server=transport, load=label, rep=rep, **result.summary(),
                           server_cpu_ms=round(ms, 3))  # fmt: skip
            finally:
                for server in servers:
                    server.stop()
    return rows


def markdown(rows: list[dict[str, Any]], transports: list[str]) -> str:
    """Median requests/s and server CPU ms per request for each load and transport."""

    def med(transport: str, load: str, key: str) -> float:
        values = [r[key] for r in rows if (r["server"], r["load"]) == (transport, load)]
        return float(statistics.median(values))

    first = transports[0]
    lines = ["| load | " + " | ".join(transports) + f" | best req/s / {first} |"]
    lines.append("|---|" + "---|" * (len(transports) + 1))
    for label, *_ in LOADS:
        rate = {t: med(t, label, "throughput") for t in transports}
        cpu = {t: med(t, label, "server_cpu_ms") for t in transports}
        best = max(rate, key=lambda t: rate[t])
        cells = " | ".join(f"{rate[t]:,.1f} req/s, {cpu[t]:.2f} ms CPU" for t in transports)
        lines.append(f"| {label} | {cells} | {best}: {rate[best] / rate[first]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        parser = argparse.ArgumentParser(prog="benchmarks.grpc_transports serve")
        parser.add_argument("transport")
        parser.add_argument("--port", type=int, default=0)
        parser.add_argument("--reuse-port", action="store_true")
        parser.add_argument("--repo", type=Path, help="the model repository (dlscale-sync-T)")
        args = parser.parse_args(argv[1:])
        if args.transport == "aio":
            asyncio.run(serve_aio(args.port, args.reuse_port))
        elif args.transport.startswith("dlscale-sync-"):
            threads = int(args.transport.removeprefix("dlscale-sync-"))
            serve_dlscale_sync(args.port, threads, args.repo)
        else:
            serve_sync(args.port, int(args.transport.removeprefix("sync-")))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds measured per run")
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    args = parser.parse_args(argv)
    rows = run(args.repeats, args.duration, args.transports)
    text = markdown(rows, args.transports)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"grpc-transports-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": machine(), "rows": rows, "table": text}, indent=1))
    print(f"{text}\n\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
