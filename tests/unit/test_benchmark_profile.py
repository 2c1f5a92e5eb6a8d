"""benchmarks/profile_large.py puts py-spy's samples in the stages of a request."""

from __future__ import annotations

from pathlib import Path

from benchmarks.profile_large import read_raw, stage_of

LOOP = [
    "Runner.run (asyncio/runners.py:118)",
    "uv_run (core.c:452)",
    "uv__io_poll (linux.c:1432)",
    "uv__stream_io (stream.c:1250)",
]


def test_the_innermost_known_frame_names_the_stage() -> None:
    serialize = [*LOOP, "_write_answer (dlscale/frontends/grpc/frontend.py:129)"]
    serialize += ["serialize (dlscale/wire/grpc.py:127)", "0x7f6f02b8ba04 (libc.so.6)"]
    assert stage_of(serialize) == "encode"
    assert stage_of([*LOOP, "uv__read (stream.c:1154)", "read (libc.so.6)"]) == "receive"
    assert stage_of([*LOOP, "uv__write (stream.c:860)", "writev (libc.so.6)"]) == "send"
    session = "Session.run (onnxruntime/capi/onnxruntime_inference_collection.py:406)"
    assert stage_of(["_worker (concurrent/futures/thread.py:83)", session]) == "backend"
    grpc_copy = "0x7fe241a765e7 (grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so)"
    assert stage_of([*LOOP, grpc_copy, "0x7fe24a38bb75 (libc.so.6)"]) == "gRPC core"
    assert stage_of(["main (x.py:1)", "mystery (y.py:2)"]) == "other"


def test_waiting_is_idle_and_waking_the_loop_is_hand_off() -> None:
    assert stage_of([*LOOP[:3], "epoll_pwait (libc.so.6)"]) == "idle"
    waiting = ["_worker (concurrent/futures/thread.py:81)", "PyThread_acquire_lock_timed (x)"]
    assert stage_of([*waiting, "0x7f6f02aa3f16 (libc.so.6)"]) == "idle"
    wake = ["call_soon_threadsafe (loop.c:1)", "uv_async_send (async.c:73)", "write (libc.so.6)"]
    assert stage_of(wake) == "queue/batch"


def test_raw_output_is_counted_per_stage(tmp_path: Path) -> None:
    raw = tmp_path / "rest.txt"
    read = ";".join([*LOOP, "uv__read (stream.c:1154)", "read (libc.so.6)"])
    idle = ";".join([*LOOP[:3], "epoll_pwait (libc.so.6)"])
    raw.write_text(f"{read} 7\n{idle} 5\n{read} 2\n")
    assert read_raw(raw) == {"receive": 9, "idle": 5}
