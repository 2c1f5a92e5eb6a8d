"""Progress: a live line on a terminal, whole lines elsewhere (logs, CI)."""

from __future__ import annotations

import io

from dlscale.bench.loadgen import Recorder
from dlscale.bench.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_without_a_terminal_each_report_is_a_whole_line() -> None:
    stream, rec = io.StringIO(), Recorder()
    progress = Progress("Offline", rec, stream)
    assert not progress.live and progress.interval_s == 10.0
    rec.issued = rec.completed = 5
    progress.tick()
    progress.tick()
    lines = stream.getvalue().split("\n")
    assert len(lines) == 3 and lines[-1] == ""
    assert all(line.startswith("Offline") and "completed 5" in line for line in lines[:2])
    assert "\r" not in stream.getvalue()


def test_on_a_terminal_one_line_is_rewritten() -> None:
    stream = _Terminal()
    progress = Progress("Server", Recorder(), stream)
    assert progress.live and progress.interval_s == 0.5
    progress.tick()
    assert stream.getvalue().startswith("\r\x1b[2KServer") and "\n" not in stream.getvalue()
