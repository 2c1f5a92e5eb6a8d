"""Progress on stderr: elapsed, issued, completed, current rate, p99 so far.

On a terminal one line is rewritten twice a second; otherwise (a log file, CI) a whole line is
written every 10 s, so that a long run is never silent.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

import numpy as np

from dlscale.bench.loadgen import Recorder

#: The p99 so far is computed over at most this many of the latest timings (cheap at 2 Hz).
WINDOW = 20_000


class Progress:
    """Reports a run while it lasts (a context manager): live on a terminal, else periodic."""

    def __init__(self, label: str, rec: Recorder, stream: TextIO | None = None) -> None:
        self.label = label
        self.rec = rec
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.interval_s = 0.5 if self.live else 10.0
        self._start = self._last_t = time.perf_counter()
        self._last_done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-progress", daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.live:
            self.stream.write("\n")
            self.stream.flush()

    def tick(self) -> None:
        """Report once: rewrite the live line, or write a whole line."""
        now, rec = time.perf_counter(), self.rec
        rate = (rec.completed - self._last_done) / max(now - self._last_t, 1e-9)
        self._last_t, self._last_done = now, rec.completed
        recent = rec.latencies_ns[-WINDOW:]
        p99 = f"{np.percentile(recent, 99) / 1e6:.2f} ms" if recent else "-"
        errors = f"  errors {rec.errors}" if rec.errors else ""
        line = (
            f"{self.label}  {now - self._start:6.1f}s  issued {rec.issued}  completed "
            f"{rec.completed}  {rate:,.0f}/s  p99 {p99}{errors}"
        )
        self.stream.write("\r\x1b[2K" + line if self.live else line + "\n")
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()


class Steps:
    """A long command's steps as whole lines on stderr, with the seconds since it began, so that
    no phase (loading, warm-up, a server starting, the report) passes in silence."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._start = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self._start
            self.stream.write(f"[{elapsed:7.1f} s] {message}\n")
            self.stream.flush()


class Countdown:
    """A load point's requests as they end, with an ETA, on stderr while the point lasts (a
    context manager): a generative point may take minutes, and must not pass in silence.

    A line every `interval_s` (live on a terminal: rewritten), and one when the point ends.
    `done()` is called as each request ends, from any thread.
    """

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO | None = None,
        interval_s: float | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.interval_s = interval_s if interval_s is not None else (1.0 if self.live else 10.0)
        self.finished = 0
        self.failed = 0
        self._start = time.perf_counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-countdown", daemon=True)

    def done(self, ok: bool = True) -> None:
        """One request ended (`ok`: it streamed an answer)."""
        with self._lock:
            self.finished += 1
            self.failed += 0 if ok else 1

    def line(self) -> str:
        """Where the point stands: requests ended of all, failures, elapsed, ETA."""
        with self._lock:
            finished, failed = self.finished, self.failed
        elapsed = time.perf_counter() - self._start
        left = self.total - finished
        eta = f"ETA {elapsed / finished * left:.0f} s" if finished else "ETA -"
        failures = f", {failed} failed" if failed else ""
        return f"{self.label}: {finished}/{self.total} requests{failures}, {elapsed:.0f} s, {eta}"

    def __enter__(self) -> Countdown:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._write(self.line(), final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write(self.line())

    def _write(self, line: str, final: bool = False) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
