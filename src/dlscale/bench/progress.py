"""The live progress line on stderr: elapsed, issued, completed, current rate, p99 so far."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

import numpy as np

from dlscale.bench.loadgen import Recorder

#: The p99 so far is computed over at most this many of the latest timings (cheap at 2 Hz).
WINDOW = 20_000


def format_line(label: str, rec: Recorder, elapsed_s: float, rate: float) -> str:
    """One status line."""
    recent = rec.latencies_ns[-WINDOW:]
    p99 = f"{np.percentile(recent, 99) / 1e6:.2f} ms" if recent else "-"
    errors = f"  errors {rec.errors}" if rec.errors else ""
    return (
        f"{label}  {elapsed_s:6.1f}s  issued {rec.issued}  completed {rec.completed}  "
        f"{rate:,.0f}/s  p99 {p99}{errors}"
    )


class Progress:
    """Rewrites one line on a terminal twice a second while a run lasts (a context manager)."""

    def __init__(
        self, label: str, rec: Recorder, stream: TextIO | None = None, interval_s: float = 0.5
    ) -> None:
        self.label = label
        self.rec = rec
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-progress", daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.stream.write("\n")
        self.stream.flush()

    def _loop(self) -> None:
        start = time.perf_counter()
        last_t, last_done = start, 0
        while not self._stop.wait(self.interval_s):
            now = time.perf_counter()
            done = self.rec.completed
            rate = (done - last_done) / (now - last_t)
            last_t, last_done = now, done
            line = format_line(self.label, self.rec, now - start, rate)
            self.stream.write("\r\x1b[2K" + line)
            self.stream.flush()
