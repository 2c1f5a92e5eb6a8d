"""The queue delay's timer (serving/wake_timer.py) on asyncio's loop and on uvloop: it fires once,
never before its delay, the latest arming wins, and closing gives its descriptor back."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from dlscale.serving.wake_timer import WakeTimer

pytestmark = pytest.mark.skipif(not WakeTimer.available(), reason="no timerfd on this system")

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def _on(loop_name: str, main: Callable[[asyncio.AbstractEventLoop], Awaitable[None]]) -> None:
    loop = LOOPS[loop_name]()
    try:
        loop.run_until_complete(main(loop))
    finally:
        loop.close()


@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_wait_under_a_millisecond_fires_once_and_not_before_its_delay(loop_name: str) -> None:
    # uvloop would run a 300 us `call_later` at once (it rounds to whole milliseconds).
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        timer = WakeTimer(loop)
        fired: list[float] = []
        start = time.perf_counter()
        timer.call_later(300e-6, lambda: fired.append(time.perf_counter() - start))
        while not fired:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        assert len(fired) == 1 and fired[0] >= 300e-6
        timer.close()

    _on(loop_name, main)


@pytest.mark.parametrize("loop_name", LOOPS)
def test_the_latest_arming_wins_and_a_cancelled_wait_calls_nothing(loop_name: str) -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        timer = WakeTimer(loop)
        calls: list[str] = []
        timer.call_later(0.002, calls.append, "first")
        timer.call_later(0.001, calls.append, "second")  # replaces the first
        await asyncio.sleep(0.02)
        assert calls == ["second"]
        timer.call_later(0.001, calls.append, "cancelled").cancel()
        await asyncio.sleep(0.01)
        timer.call_later(0.0, calls.append, "at once")  # a zero delay is not a disarmed timer
        await asyncio.sleep(0)
        assert calls == ["second", "at once"]
        timer.close()

    _on(loop_name, main)


def test_closing_gives_the_descriptor_back() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        timer = WakeTimer(loop)
        fired = loop.create_future()
        timer.call_later(1e-4, fired.set_result, None)
        await fired
        fd = timer._fd
        assert fd >= 0
        timer.close()
        with pytest.raises(OSError):
            os.fstat(fd)
        timer.close()  # twice is harmless

    _on("uvloop", main)
