"""Where a 19 MB request's time goes in `dlscale serve`, over binary REST and over gRPC.

    python -m benchmarks.profile_large [--duration 8] [--rate 200] [--small] [--revision REV]

Starts `dlscale serve` (this checkout, or `--revision`) on benchmarks/large.py's repository,
drives one load at a time with large.py's clients (identity FP32 [32, 3, 224, 224], 4 in
flight; with --small, [1, 16] at 32 in flight), and samples the server meanwhile with py-spy
(`pip install py-spy`, in the [dev] extra) in --native mode, which pauses the process for each
sample: it runs slower than unprofiled. Each busy sample is put in one stage by the innermost
frame a rule knows (`STAGES`); samples that wait (epoll, a lock, a condition) are idle. The
table gives each stage's milliseconds per request (samples / rate / requests), and the
process's whole CPU time per request from /proc (threads py-spy does not sample make up the
difference).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.harness.clients import LoadResult
from benchmarks.harness.loads import LOADS, Load, drive
from benchmarks.harness.models import SMALL, build_large_repository
from benchmarks.harness.revisions import checkout, start_revision
from benchmarks.harness.servers import WORK, ServerProcess, cpu_seconds

#: (stage, where fragment, function fragments or () for any): the innermost frame that matches
#: one of these, in this order, names a sample's stage. Frames are py-spy's `function (where)`,
#: Python's and native ones (--native): `where` is `file:line` or the library's name.
STAGES: list[tuple[str, str, tuple[str, ...]]] = [
    ("backend", "onnxruntime", ()),
    ("backend", "dlscale/backends/", ()),
    ("encode", "dlscale/wire/", ("encode", "_write", "frame_infer_response", "serialize",
                                "field_parts", "embedded", "_body", "_to_raw")),
    ("encode", "frontends/grpc/frontend.py", ("_write_answer",)),
    ("decode", "dlscale/wire/", ()),
    ("decode", "frontends/grpc/", ("_read_request", "_plain", "_large")),
    ("decode", "frontends/offload.py", ()),  # handing a large decode to a thread
    ("queue/batch", "dlscale/serving/", ()),
    ("queue/batch", "concurrent/futures/", ()),  # an instance's thread and its answer
    ("queue/batch", "asyncio/futures.py", ()),
    ("parse", "frontends/rest/reading.py", ("on_url", "on_header", "on_message_begin",
                                            "on_headers_complete")),
    ("parse", "frontends/rest/connection.py", ("_feed",)),
    ("parse", "frontends/rest/api.py", ("_route", "_resolve", "_decoded", "_json_object")),
    ("receive", "frontends/rest/", ("get_buffer", "buffer_updated", "_body_in_place",
                                    "on_body", "take", "space", "received", "finish")),
    ("send", "frontends/rest/connection.py", ("_write",)),
    ("receive", "stream.c", ("uv__read",)),  # uvloop (libuv) reading into the body's buffer
    ("send", "stream.c", ("uv__write", "uv__try_write")),
    ("send", "libc", ("writev", "sendmsg")),
    ("receive", "libc", ("recvmsg",)),
    ("gRPC core", "cygrpc", ()),  # grpcio's C core and Cython layer, no symbols to split it
]  # fmt: skip
#: A sample whose innermost frames wait is idle (py-spy may count such threads as busy).
WAITS = {"epoll_wait", "epoll_pwait", "pthread_cond_wait", "pthread_cond_timedwait",
         "PyThread_acquire_lock_timed", "sem_wait", "sem_timedwait", "poll", "select"}  # fmt: skip
#: A thread waking the event loop (an answer handed back): part of queue/batch.
WAKES = ("call_soon_threadsafe", "eventfd_write")
ORDER = ["parse", "receive", "decode", "queue/batch", "backend", "encode", "send", "gRPC core",
         "other"]  # fmt: skip


def stage_of(stack: list[str]) -> str:
    """The stage of one sample: its frames from the outermost, each `function (where)`."""
    if any(frame.partition(" (")[0] in WAITS for frame in stack[-4:]):
        return "idle"
    if any(wake in frame for frame in stack for wake in WAKES):
        return "queue/batch"
    for frame in reversed(stack):
        function, _, where = frame.partition(" (")
        for stage, fragment, functions in STAGES:
            if fragment in where and (not functions or any(f in function for f in functions)):
                return stage
    return "other"


def read_raw(path: Path) -> collections.Counter[str]:
    """Samples per stage from py-spy's raw output (`frame;frame;... count` per line)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            counts[stage_of(stack.split(";"))] += int(n)
    return counts


def profile(server: ServerProcess, ports: tuple[int, int], load: Load, duration: float,
            rate: int, folder: Path) -> dict[str, float]:  # fmt: skip
    """ms per request in each stage, and the process's CPU ms per request, for one load."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    _, protocol, model, rows, concurrency = load
    raw = folder / f"{protocol}-{model.name}.txt"
    argv = [spy, "record", "--pid", str(server.proc.pid), "--format", "raw", "--rate", str(rate)]
    argv += ["--duration", str(int(duration)), "--output", str(raw), "--native"]
    loads: list[LoadResult] = []
    # The load runs a second longer than the sampling on both sides, so every sample sees it.
    load = threading.Thread(
        target=lambda: loads.append(
            drive(protocol, model, rows, concurrency, ports, duration + 2.0)
        )
    )
    load.start()
    time.sleep(2.0)  # the client's one second of warm-up, and one more
    before = cpu_seconds(server.proc.pid)
    subprocess.run(argv, check=True, capture_output=True)
    cpu = cpu_seconds(server.proc.pid) - before
    load.join()
    result = loads[0]
    requests = result.throughput * duration
    counts = read_raw(raw)
    out = {stage: counts[stage] / rate / requests * 1e3 for stage in ORDER}
    out["sampled busy"] = (sum(counts.values()) - counts["idle"]) / rate / requests * 1e3
    out["process CPU"] = cpu / requests * 1e3
    out["requests/s"] = result.throughput
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds sampled per load")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--small", action="store_true", help="the [1,16] loads, not the 19 MB")
    parser.add_argument("--revision", help="profile this git revision instead of the checkout")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw samples in this folder")
    parser.add_argument(
        "--stages", type=Path, nargs="+", help="only count saved raw samples per stage, as JSON"
    )
    args = parser.parse_args(argv)
    if args.stages:
        print(json.dumps({str(path): read_raw(path) for path in args.stages}))
        return 0
    WORK.mkdir(exist_ok=True)
    repo = build_large_repository(WORK / "large-repo")
    tree = Path(".") if args.revision is None else checkout(args.revision)
    server, http, grpc_port = start_revision(tree, repo)
    results: dict[str, dict[str, float]] = {}
    loads = [load for load in LOADS if (load[2] is SMALL) == args.small]
    try:
        with tempfile.TemporaryDirectory() as scratch:
            folder = args.raw or Path(scratch)
            folder.mkdir(parents=True, exist_ok=True)
            for load in loads:
                results[load[0]] = profile(
                    server, (http, grpc_port), load, args.duration, args.rate, folder
                )
    finally:
        server.stop()
    print("| ms per request | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
    for key in [*ORDER, "sampled busy", "process CPU", "requests/s"]:
        print(f"| {key} | " + " | ".join(f"{r[key]:.3f}" for r in results.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
