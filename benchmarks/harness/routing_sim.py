"""A simulation of benchmarks/routing.py's fleet: which p99 each way of routing can reach.

    python -m benchmarks.harness.routing_sim [--seconds 300] [--rates 60,70,80,90]

Two replicas batching up to 4 rows, 50 and 150 ms per batch, each starting a batch as soon as
its device is free and a request waits (the null model with `max_queue_delay_us` 0); Poisson
arrivals. Routers:
- `leastconn W/w`: HAProxy 2.6's weighted leastconn as its src/lb_fwlc.c computes it (a server
  with nothing in flight first, else the fewest `(in flight + 1) / weight`), optionally with a
  `maxconn` per server and HAProxy's queue for the first slot that frees;
- `leastconn by scale/weights.py`: the weights the Weigher gives at each rate;
- `first`: HAProxy's `balance first`, the fast replica first until it holds its `maxconn`, then
  the slow one;
- `finish first`: the replica where the request would finish first, from each one's queue and
  the time left on its batch, as scale/finish.lua keeps them in HAProxy (from the requests it
  sends and the answers it sees; exact here, where the hop is the only time not modelled);
- `fewest in flight, ties at random`: Ray Serve's default router over two replicas (its power of
  two choices samples both and takes the shorter queue), uncapped.
The real run's figures for the weights 256/29 at 70/s (p99 204 ms, the slow replica's share
8.6%, 14% of the tail on it) match the simulation's (199 ms, 8.7%, 12%).
"""

from __future__ import annotations

import argparse
import heapq
import random
from dataclasses import dataclass

import numpy as np

from dlscale.scale.weights import heaviness, weight_of

BATCH = 4
TIMES_S = (0.05, 0.15)
#: Seconds from HAProxy to a replica's batcher.
HOP_S = 0.0005


@dataclass(frozen=True)
class Router:
    """How a request is placed: leastconn by `weights` (optionally capped), finish first, or
    Ray's power of two choices."""

    weights: tuple[int, int] = (256, 256)
    caps: tuple[int | None, int | None] = (None, None)
    finish_first: bool = False
    two_choices: bool = False
    first: bool = False


@dataclass(frozen=True)
class Outcome:
    """What one simulated run measured."""

    p50_ms: float
    p99_ms: float
    slow_share: float
    tail_on_slow: float


class _Fleet:
    """The replicas' state: in flight (as HAProxy counts), waiting at each, busy until."""

    def __init__(self, router: Router, seed: int) -> None:
        self.router = router
        self.rng = random.Random(seed)
        self.inflight = [0, 0]
        self.waiting: list[list[int]] = [[], []]
        self.busy_until: list[float | None] = [None, None]

    def choose(self, now: float) -> int | None:
        """The replica for the next request, or None when every one is at its cap."""
        open_ = [
            s
            for s in (0, 1)
            if self.router.caps[s] is None or self.inflight[s] < (self.router.caps[s] or 0)
        ]
        if not open_:
            return None
        if self.router.finish_first:
            return min(open_, key=lambda s: (self._finish(s, now), s))
        if self.router.first:
            return open_[0]
        if self.router.two_choices:
            return min(open_, key=lambda s: (self.inflight[s], self.rng.random()))
        return min(open_, key=lambda s: (self._key(s), s))

    def _key(self, s: int) -> float:
        n = self.inflight[s]
        return 0.0 if n == 0 else (n + 1) / self.router.weights[s]

    def _finish(self, s: int, now: float) -> float:
        batches = len(self.waiting[s]) // BATCH + 1
        left = (self.busy_until[s] or now) - now
        return left + batches * TIMES_S[s]


def simulate(router: Router, rate: float, seconds: float, seed: int = 1) -> Outcome:
    """One run of `seconds` of Poisson arrivals at `rate` per second."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    t = 0.0
    while t < seconds:
        t += rng.expovariate(rate)
        arrivals.append(t)
    events: list[tuple[float, int, int, tuple[int, ...]]] = [
        (a, 0, i, ()) for i, a in enumerate(arrivals)
    ]
    heapq.heapify(events)
    fleet, queue = _Fleet(router, seed), []
    latency = [0.0] * len(arrivals)
    where = [0] * len(arrivals)

    def place(i: int, s: int, now: float) -> None:
        fleet.inflight[s] += 1
        where[i] = s
        fleet.waiting[s].append(i)
        heapq.heappush(events, (now + HOP_S, 1, s, ()))

    def start(s: int, now: float) -> None:
        if fleet.busy_until[s] is None and fleet.waiting[s]:
            batch = tuple(fleet.waiting[s][:BATCH])
            del fleet.waiting[s][:BATCH]
            fleet.busy_until[s] = now + TIMES_S[s]
            heapq.heappush(events, (now + TIMES_S[s], 2, s, batch))

    while events:
        now, kind, which, batch = heapq.heappop(events)
        if kind == 0:  # an arrival
            s = fleet.choose(now)
            if s is None:
                queue.append(which)
            else:
                place(which, s, now)
        elif kind == 1:  # a request reached replica `which`
            start(which, now)
        else:  # replica `which` finished `batch`
            fleet.busy_until[which] = None
            for i in batch:
                latency[i] = now - arrivals[i]
                fleet.inflight[which] -= 1
            while queue and (s := fleet.choose(now)) is not None:
                place(queue.pop(0), s, now)
            start(which, now)
    ms = np.array(latency) * 1e3
    slow = np.array(where) == 1
    p99 = float(np.percentile(ms, 99))
    return Outcome(
        round(float(np.percentile(ms, 50)), 1),
        round(p99, 1),
        round(float(slow.mean()), 3),
        round(float(slow[ms >= p99].mean()), 2),
    )


ROUTERS = {
    "leastconn 256/256": Router(),
    "leastconn 256/85 (speed ratio)": Router((256, 85)),
    "leastconn 256/50": Router((256, 50)),
    "leastconn 256/29 (batching)": Router((256, 29)),
    "leastconn 256/29, maxconn 8/4": Router((256, 29), (8, 4)),
    "leastconn 256/29, maxconn 16/1": Router((256, 29), (16, 1)),
    "first, maxconn 8 on fast (slow uncapped)": Router(caps=(8, None), first=True),
    "first, maxconn 12 on fast (slow uncapped)": Router(caps=(12, None), first=True),
    "finish first (scale/finish.lua)": Router(finish_first=True),
    "fewest in flight, ties at random (Ray Serve's default, uncapped)": Router(two_choices=True),
}


def weighed(rate: float) -> Router:
    """Leastconn with the weights scale/weights.py gives this fleet at `rate` (its load over
    the light-load capacity: the fast replica's batches, one row per batch of the slow one)."""
    light = BATCH / TIMES_S[0] + 1 / TIMES_S[1]
    slower = TIMES_S[1] / TIMES_S[0]
    return Router((256, weight_of(slower, BATCH, heaviness(rate / light))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--rates", default="60,70,80,90")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    print("| router | " + " | ".join(f"p99 at {r:g}/s (slow share)" for r in rates) + " |")
    print("|---" * (len(rates) + 1) + "|")
    for name, router in ROUTERS.items():
        cells = [simulate(router, rate, args.seconds) for rate in rates]
        print(
            f"| {name} | "
            + " | ".join(f"{c.p99_ms:.0f} ({c.slow_share:.2f})" for c in cells)
            + " |"
        )
    cells = [simulate(weighed(rate), rate, args.seconds) for rate in rates]
    weights = "/".join(str(weighed(rate).weights[1]) for rate in rates)
    print(
        f"| leastconn by scale/weights.py (slow: {weights}) | "
        + " | ".join(f"{c.p99_ms:.0f} ({c.slow_share:.2f})" for c in cells)
        + " |"
    )


if __name__ == "__main__":
    main()
