"""benchmarks/profile_large.py puts py-spy's samples in the stages of a request.

The script runs as its user runs it (`--stages RAW...` counts saved samples per stage), so
that the tests depend on benchmarks/ only through its command line.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.toolkit.benchmarks import run_benchmark

LOOP = [
    "Runner.run (asyncio/runners.py:118)",
    "uv_run (core.c:452)",
    "uv__io_poll (linux.c:1432)",
    "uv__stream_io (stream.c:1250)",
]


def stages(folder: Path, *raws: str) -> list[dict[str, int]]:
    """What profile_large counts in each of `raws` (py-spy's raw format), in order."""
    paths = []
    for i, raw in enumerate(raws):
        paths.append(folder / f"{i}.txt")
        paths[-1].write_text(raw)
    done = run_benchmark("profile_large", "--stages", *map(str, paths))
    assert done.returncode == 0, done.stdout + done.stderr
    counted: dict[str, dict[str, int]] = json.loads(done.stdout)
    return [counted[str(p)] for p in paths]


def stage_of(*stacks: list[str], folder: Path) -> list[str]:
    """The stage of each stack: the one key of its one-sample count."""
    found = stages(folder, *(";".join(stack) + " 1\n" for stack in stacks))
    assert all(len(count) == 1 for count in found), found
    return [next(iter(count)) for count in found]


def test_the_innermost_known_frame_names_the_stage(tmp_path: Path) -> None:
    serialize = [*LOOP, "_write_answer (dlscale/frontends/grpc/frontend.py:129)"]
    serialize += ["serialize (dlscale/wire/grpc.py:127)", "0x7f6f02b8ba04 (libc.so.6)"]
    session = "Session.run (onnxruntime/capi/onnxruntime_inference_collection.py:406)"
    grpc_copy = "0x7fe241a765e7 (grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)"
    found = stage_of(
        serialize,
        [*LOOP, "uv__read (stream.c:1154)", "read (libc.so.6)"],
        [*LOOP, "uv__write (stream.c:860)", "writev (libc.so.6)"],
        ["_worker (concurrent/futures/thread.py:83)", session],
        [*LOOP, grpc_copy, "0x7fe24a38bb75 (libc.so.6)"],
        ["main (x.py:1)", "mystery (y.py:2)"],
        folder=tmp_path,
    )
    assert found[0] == "encode"
    assert found[1] == "receive"
    assert found[2] == "send"
    assert found[3] == "backend"
    assert found[4] == "gRPC core"
    assert found[5] == "other"


def test_waiting_is_idle_and_waking_the_loop_is_hand_off(tmp_path: Path) -> None:
    waiting = ["_worker (concurrent/futures/thread.py:81)", "PyThread_acquire_lock_timed (x)"]
    wake = ["call_soon_threadsafe (loop.c:1)", "uv_async_send (async.c:73)", "write (libc.so.6)"]
    found = stage_of(
        [*LOOP[:3], "epoll_pwait (libc.so.6)"],
        [*waiting, "0x7f6f02aa3f16 (libc.so.6)"],
        wake,
        folder=tmp_path,
    )
    assert found[0] == "idle"
    assert found[1] == "idle"
    assert found[2] == "queue/batch"


def test_raw_output_is_counted_per_stage(tmp_path: Path) -> None:
    read = ";".join([*LOOP, "uv__read (stream.c:1154)", "read (libc.so.6)"])
    idle = ";".join([*LOOP[:3], "epoll_pwait (libc.so.6)"])
    assert stages(tmp_path, f"{read} 7\n{idle} 5\n{read} 2\n") == [{"receive": 9, "idle": 5}]
