"""An instance's lane: its calls run in its own threads, in order, and their outcomes come back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dlscale.serving.instance import Lane


async def test_a_lane_of_one_thread_runs_its_calls_one_at_a_time_in_order() -> None:
    lane = Lane("ordered")
    running, ran, threads = [0], [], set()

    def work(n: int) -> int:
        running[0] += 1
        assert running[0] == 1, "two calls overlapped"
        threads.add(threading.current_thread().name)
        time.sleep(0.001)
        ran.append(n)
        running[0] -= 1
        return n * 2

    try:
        answers = await asyncio.gather(*(lane.run(work, n) for n in range(20)))
    finally:
        lane.stop()
    assert answers == [n * 2 for n in range(20)]
    assert ran == list(range(20))
    assert threads == {"ordered_0"}  # the instance's own thread, not the loop's


async def test_an_error_in_the_thread_reaches_the_caller_and_the_lane_keeps_serving() -> None:
    lane = Lane("failing")

    def fail() -> None:
        raise ValueError("the model broke")

    try:
        with pytest.raises(ValueError, match="the model broke"):
            await lane.run(fail)
        assert await lane.run(lambda: "still here") == "still here"
    finally:
        lane.stop()


async def test_submit_hands_the_outcome_to_its_callback_on_the_loop() -> None:
    lane = Lane("callbacks")
    loop = asyncio.get_running_loop()
    outcomes: asyncio.Queue[tuple[object, BaseException | None, bool]] = asyncio.Queue()

    def then(result: object, error: BaseException | None) -> None:
        on_loop = threading.current_thread() is threading.main_thread()
        loop.call_soon(outcomes.put_nowait, (result, error, on_loop))

    try:
        lane.submit(int, ("7",), then)
        lane.submit(int, ("seven",), then)
        first, second = await outcomes.get(), await outcomes.get()
    finally:
        lane.stop()
    assert first == (7, None, True)
    assert second[0] is None and isinstance(second[1], ValueError) and second[2]


async def test_a_blocking_call_from_a_worker_thread_runs_in_the_lane() -> None:
    lane = Lane("blocking")
    try:
        name = await asyncio.to_thread(lane.call, lambda: threading.current_thread().name)
    finally:
        lane.stop()
    assert name == "blocking_0"


def test_a_call_whose_loop_closed_meanwhile_leaves_the_lane_serving() -> None:
    lane = Lane("orphaned")
    release = threading.Event()

    async def leave_early() -> None:
        lane.run(release.wait)  # its loop closes before the call returns

    asyncio.run(leave_early())
    release.set()

    async def next_caller() -> int:  # bounded: a thread that died would never answer
        return await asyncio.wait_for(lane.run(lambda: 42), 10)

    try:
        assert asyncio.run(next_caller()) == 42
    finally:
        lane.stop()


async def test_stopped_threads_end_once_the_calls_given_have_run() -> None:
    lane = Lane("stopping")
    lane.grow(2)
    threads = [t for t in threading.enumerate() if t.name.startswith("stopping_")]
    answer = lane.run(time.sleep, 0.01)
    lane.stop()
    assert await answer is None
    for thread in threads:
        thread.join(timeout=10)
    assert len(threads) == 2 and not any(t.is_alive() for t in threads)
