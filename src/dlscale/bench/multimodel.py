"""Many models at once: a Zipf mix of requests over N models, against a server that holds only
what fits its memory budget (docs/memory.md), with the repository index sampled every 100 ms.

A request is *resident* when the last sample before it was sent had its model READY, *cold*
otherwise (a sample is 100 ms old at most, so a request at the edge of a load can be counted on
either side). A load is a model turning READY between two samples.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import psutil

from dlscale.errors import BenchError
from dlscale.types import Datatype

#: The repository index is read this often (the budget is checked on every sample).
SAMPLE_S = 0.1


@dataclass(frozen=True)
class Mix:
    """The request mix: models by Zipf rank (the first name the most asked), rate, duration."""

    models: tuple[str, ...]
    zipf: float = 1.1
    rate: float = 50.0
    duration_s: float = 30.0
    seed: int = 0

    def schedule(self) -> list[tuple[float, str]]:
        """(seconds from the start, model) of each request: Poisson arrivals, Zipf models."""
        rng = np.random.default_rng(self.seed)
        ranks = np.arange(1, len(self.models) + 1, dtype=np.float64)
        weights = ranks**-self.zipf
        gaps = rng.exponential(1 / self.rate, int(self.rate * self.duration_s * 1.2) + 1)
        times = np.cumsum(gaps)
        times = times[times < self.duration_s]
        picks = rng.choice(len(self.models), size=len(times), p=weights / weights.sum())
        return [(float(t), self.models[i]) for t, i in zip(times, picks, strict=True)]


@dataclass
class Sample:
    """One read of the server: when, the READY models, the bytes they hold, the process RSS."""

    at: float
    ready: frozenset[str]
    resident_bytes: int
    rss_bytes: int | None = None


@dataclass
class Sent:
    """One request: when it left, its model, its latency, its outcome, resident or cold."""

    at: float
    model: str
    latency_s: float
    status: int
    cold: bool


class IndexSampler:
    """Reads the repository index (and the server's RSS, when its pid is known) every 100 ms."""

    def __init__(self, url: str, pid: int | None = None) -> None:
        self.url = url
        self.pid = pid
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="index-sampler", daemon=True)
        self.start = time.monotonic()

    def latest(self) -> Sample | None:
        """The last sample taken (None before the first)."""
        return self.samples[-1] if self.samples else None

    def __enter__(self) -> IndexSampler:
        self.start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        process = psutil.Process(self.pid) if self.pid else None
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.is_set():
                rows = client.post("/v2/repository/index", json={}).json()
                ready = [r for r in rows if r.get("state") == "READY"]
                held = sum(sum(r.get("memory", {}).values()) for r in ready)
                rss = _rss(process) if process is not None else None
                at = time.monotonic() - self.start
                self.samples.append(Sample(at, frozenset(r["name"] for r in ready), held, rss))
                self._stop.wait(SAMPLE_S)


def _rss(process: psutil.Process) -> int | None:
    try:
        return int(process.memory_info().rss) + sum(
            int(c.memory_info().rss) for c in process.children(recursive=True)
        )
    except psutil.Error:
        return None


def bodies(url: str, models: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """A JSON inference body of one row of zeros for each model, from the signature the server
    (holding every model) reports; a dynamic dimension is sent as 1."""
    out = {}
    with httpx.Client(base_url=url, timeout=60) as client:
        for name in models:
            answer = client.get(f"/v2/models/{name}")
            if answer.status_code != 200:
                raise BenchError(f"model {name!r}: no metadata ({answer.status_code})")
            inputs = []
            for spec in answer.json()["inputs"]:
                shape = [max(int(d), 1) for d in spec["shape"]]
                dtype = Datatype(spec["datatype"])
                data = np.zeros(shape, dtype=dtype.numpy) if dtype is not Datatype.BYTES else None
                flat = data.ravel().tolist() if data is not None else [""] * int(np.prod(shape))
                inputs.append({**spec, "shape": shape, "data": flat})
            out[name] = {"inputs": inputs}
    return out


async def drive(
    url: str,
    schedule: list[tuple[float, str]],
    bodies: Mapping[str, dict[str, Any]],
    sampler: IndexSampler,
) -> list[Sent]:
    """Send the schedule (open loop: each request at its time, whatever the answers do)."""
    sent: list[Sent] = []
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one(at: float, model: str) -> None:
            latest = sampler.latest()
            cold = latest is None or model not in latest.ready
            start = time.monotonic()
            try:
                answer = await client.post(f"/v2/models/{model}/infer", json=bodies[model])
                status = answer.status_code
            except httpx.HTTPError:
                status = 0
            sent.append(Sent(at, model, time.monotonic() - start, status, cold))

        tasks = []
        begin = time.monotonic()
        for at, model in schedule:
            delay = begin + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(at, model)))
        await asyncio.gather(*tasks)
    return sorted(sent, key=lambda s: s.at)


@dataclass
class Phase:
    """One run of the mix against one server, and what the sampler saw."""

    name: str
    sent: list[Sent]
    samples: list[Sample]
    budget_bytes: int | None = None
    load_s: list[float] = field(default_factory=list)  # the server's mean load time, if known

    def loads(self) -> list[tuple[float, str]]:
        """(when, model) of each model that turned READY between two samples."""
        out: list[tuple[float, str]] = []
        for before, after in itertools.pairwise(self.samples):
            out.extend((after.at, m) for m in sorted(after.ready - before.ready))
        return out
