"""Which batches an instance computes on the event loop: the declared ones, and the measured cheap.

Handing a batch to the instance's thread and back (waking the thread, taking the GIL back,
waking the loop) costs a busy 2-core host more than a tiny model's whole compute: an ONNX
Identity over [32, 16] computes in ~10 us, the hop costs tens of microseconds of CPU and, while
the loop runs Python, up to the interpreter's switch interval (5 ms) of waiting for the GIL. A
backend that allows it (`Capabilities.inline_measured`) gets its small batches run on the loop
once they have been measured cheap, under `BOUND_S`, so that no batch taken inline holds the
loop for long:

- a batch goes to the loop only when its rows are at most the largest batch measured under the
  bound in the thread, and only after `FIRST_FAST` such batches (warm-up batches count);
- the thread's figures only ever err slow (they include the wait for the GIL), so a slow one
  teaches nothing; a batch run on the loop is timed as it held the loop, and two in a row over
  the bound (one alone may be the host preempting the loop's thread) send the instance's
  batches back to the thread, to be learnt again from twice as many fast batches (a model
  whose cost depends on its data stops trying the loop after a few such turns).
"""

from __future__ import annotations

#: The most a batch may have been measured at to be run on the event loop (seconds): the order
#: of the hop it saves, and of `Capabilities.inline_rows`' own budget.
BOUND_S = 100e-6
#: Batches measured under the bound in the thread before the first batch runs on the loop.
FIRST_FAST = 8
#: The most fast batches asked for after repeated slow turns on the loop.
MOST_FAST = 2**16
#: Batches in a row over the bound on the loop that send the batches back to the thread.
SLOW_IN_A_ROW = 2


class InlineRows:
    """The rows of the largest batch an instance may compute on the event loop now."""

    def __init__(self, declared: int = 0, measured: bool = False) -> None:
        #: The backend's own bound (`Capabilities.inline_rows`): always kept.
        self.declared = max(0, declared)
        #: Whether the bound is learnt from measured batches too (`inline_measured`).
        self.measured = measured
        self.rows = self.declared
        self._needed = FIRST_FAST
        self._fast = 0  # thread batches measured under the bound since the last slow turn
        self._largest = 0  # the rows of the largest of them
        self._slow = 0  # batches in a row over the bound on the loop

    def allows(self, rows: int) -> bool:
        """Whether a batch of `rows` runs on the event loop."""
        return self.rows > 0 and rows <= self.rows

    def observe(self, rows: int, seconds: float, on_loop: bool) -> None:
        """A batch of `rows` took `seconds`, on the loop or in the thread."""
        if not self.measured:
            return
        if on_loop:
            self._slow = self._slow + 1 if seconds > BOUND_S else 0
            if self._slow >= SLOW_IN_A_ROW:  # it held the loop: back to the thread, learnt again
                self.rows = self.declared
                self._fast = self._largest = self._slow = 0
                self._needed = min(self._needed * 2, MOST_FAST)
            return
        if seconds <= BOUND_S:
            self._fast += 1
            self._largest = max(self._largest, rows)
            if self._fast >= self._needed:
                self.rows = max(self.declared, self._largest)
