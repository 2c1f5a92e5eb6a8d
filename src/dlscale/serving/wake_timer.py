"""A timer for the batcher's queue delay that keeps microseconds: a Linux timerfd on the loop.

Event loops time their waits in whole milliseconds. uvloop (libuv) turns any delay under half a
millisecond into `call_soon`, so the Batcher waiting out the rest of a 500 us queue delay woke
at every turn of the loop until the delay had passed: 17,600 such turns in five seconds of
gRPC [1,16] at 32 clients (about seven a batch), a core spinning that the clients on the same
host needed to send the company the batch waited for. asyncio's own loop rounds the same wait up
to a whole millisecond (epoll's timeout). A timerfd (timerfd_create(2)) wakes the loop's poll at
the microsecond asked for, and the loop sleeps meanwhile.

Python has `os.timerfd_create` from 3.13 only; before that libc's calls are reached by ctypes.
Where there is no timerfd (not Linux, or no descriptor left), the loop's own timers serve.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

CLOCK_MONOTONIC = 1  # the clock of time.perf_counter and time.monotonic on Linux


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return libc if hasattr(libc, "timerfd_create") else None


_LIBC = _libc()


class WakeTimer:
    """One timer at a time, the same shape as `loop.call_later` for the one caller that waits
    (the Batcher's scheduler): arming it again replaces the wait before; `cancel` ends it. The
    descriptor is opened at the first wait (a model that never waits holds none)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fd = -1
        self._spec = _Itimerspec()  # filled in place on every arming: no object per wait
        self._call: tuple[Callable[..., None], tuple[Any, ...]] | None = None
        self._fallback: asyncio.TimerHandle | None = None  # the loop's, where arming failed

    @staticmethod
    def available() -> bool:
        """Whether the system has timerfds (Linux)."""
        return _LIBC is not None

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> WakeTimer:
        """Call `callback(*args)` on the loop `delay` seconds from now (at once if not after)."""
        self.cancel()
        if delay <= 0:  # a zero time would disarm the timerfd, not fire it
            self._loop.call_soon(callback, *args)
            return self
        value = self._spec.it_value
        value.tv_sec = int(delay)
        value.tv_nsec = max(1, int((delay - value.tv_sec) * 1e9))
        if self._fd < 0:
            self._open()
        if self._fd < 0 or _LIBC.timerfd_settime(self._fd, 0, ctypes.byref(self._spec), None):
            self._fallback = self._loop.call_later(delay, callback, *args)  # the loop's own timer
        else:
            self._call = (callback, args)
        return self

    def cancel(self) -> None:
        """Forget the wait (the timerfd may still fire: a stale expiry then calls nothing)."""
        self._call = None
        if self._fallback is not None:
            self._fallback.cancel()
            self._fallback = None

    def close(self) -> None:
        """Stop watching the descriptor and close it."""
        self.cancel()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _open(self) -> None:
        fd = _LIBC.timerfd_create(CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd >= 0:  # else out of descriptors, say: the loop's own timers serve
            self._loop.add_reader(fd, self._fired)
            self._fd = fd

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count: read to quiet the descriptor
        except BlockingIOError:  # armed again since it became readable: not this expiry
            return
        call, self._call = self._call, None
        if call is not None:
            call[0](*call[1])
