"""How long a replica takes to serve once asked for, measured, and the hold down it sets.

A replica that goes and is needed again comes back after Ray's look-back shows the need
(`LOOK_BACK_S`) and a replica starts (Ray places it, its server loads, it joins the router).
The fleet holds a replica it no longer needs `HOLD_RETURNS` times that long before it lets it
go: a drop that returning load proves wrong then costs at most a third of the hold. The start
is measured on this fleet (the latest scale-up: asked at the first decision that raised the
target, done when Ray counts every replica asked for running), so a fleet whose replicas start
fast lets go sooner; until a start is seen, REPLICA_START_S stands for it.
`--scale-down-delay` is the most it holds: on the burst bench Ray counted a replica running
6.9 s after the ask on a quiet host, so the hold stayed at the 30 s default (BENCHMARKS.md,
run 16).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Seconds over which Ray averages the replicas' figures (`look_back_period_s`, set by
#: scale/autoscale.py): a need shows in them this long after it starts.
LOOK_BACK_S = 5.0
#: Seconds from asking for a replica to its first answer: the hold's figure until a start is
#: measured, and the horizon a backlog is drained within (scale/objective.py `drain_within`,
#: always this figure). The router saw a new replica 2 s after the ask at a load average of 6,
#: 15 s at 25 on the burst bench (BENCHMARKS.md); this is about the middle.
REPLICA_START_S = 5.0
#: The hold down, in times a replica takes to return (the look-back and its start): three
#: rides out a lull of the arrivals (with the estimate above: 30 s, the hold before starts were
#: measured).
HOLD_RETURNS = 3.0


@dataclass(frozen=True)
class Starts:
    """The policy's state about replica starts: when the scale-up under way was asked for
    (None: none is), and how long the latest one took (None: none seen yet)."""

    asked: float | None = None
    took_s: float | None = None

    def asking(self, now: float) -> Starts:
        """This state once a decision at `now` asks for more replicas (or finds some starting
        that it did not see asked for: a replica Ray replaces)."""
        return self if self.asked is not None else Starts(now, self.took_s)

    def seen(self, running: int, target: int, now: float) -> Starts:
        """This state after a decision that found `running` of `target` replicas at `now`."""
        if running < target:
            return self.asking(now)
        if self.asked is None:
            return self
        return Starts(None, now - self.asked)

    @property
    def start_s(self) -> float:
        """Seconds a replica takes to serve once asked for: measured, else the estimate."""
        return REPLICA_START_S if self.took_s is None else self.took_s

    def hold_s(self, most_s: float) -> float:
        """Seconds the fleet must want fewer replicas before they go, at most `most_s`."""
        return min(most_s, HOLD_RETURNS * (LOOK_BACK_S + self.start_s))

    def says(self) -> str:
        """The hold's reason, for the decision's log line."""
        took = "not seen yet" if self.took_s is None else f"{self.took_s:.3g} s"
        return f"{HOLD_RETURNS:g} returns of {LOOK_BACK_S:g} s + a start, {took}"

    def kept(self) -> list[float | None]:
        """As Ray's policy state keeps it (JSON-like)."""
        return [self.asked, self.took_s]

    @classmethod
    def from_kept(cls, kept: object) -> Starts:
        if not isinstance(kept, list | tuple) or len(kept) != 2:
            return cls()
        asked, took = kept
        return cls(None if asked is None else float(asked), None if took is None else float(took))


#: The state before any scale-up.
NONE_SEEN = Starts()
