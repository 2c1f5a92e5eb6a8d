"""MLPerf LLM scenarios on the real LoadGen with token latencies (Server and Offline).

LoadGen is told `use_token_latencies`: the SUT calls `FirstTokenComplete` when a stream's first
text arrives and `QuerySamplesComplete` with the stream's output token count at its end, and
LoadGen computes TTFT and TPOT = (latency - TTFT) / (n_tokens - 1) itself and holds their p99
to the bounds (shared/reference/generative.md). Its summary says VALID or INVALID and why.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlperf_loadgen as lg
import numpy as np

from dlscale.bench.generative.client import StreamClient
from dlscale.bench.generative.load import Job
from dlscale.bench.generative.records import StreamRecord
from dlscale.bench.lglog import number, read_logs, summary_of
from dlscale.bench.loadgen import LoopThread
from dlscale.bench.scenarios import RunSettings, Scenario
from dlscale.errors import BenchError

#: The MLPerf LLM bounds on p99 TTFT and TPOT, in seconds (shared/reference/generative.md).
MLPERF_TOKEN_BOUNDS = {
    "llama2-70b": (2.0, 0.200),
    "llama2-70b-interactive": (0.450, 0.040),
    "llama3.1-8b": (2.0, 0.100),
    "llama3.1-8b-interactive": (0.500, 0.030),
    "llama3.1-405b": (6.0, 0.175),
    "llama3.1-405b-interactive": (4.5, 0.080),
}
DEFAULT_BOUNDS = "llama2-70b"
#: The scenarios MLPerf runs its LLMs in.
TOKEN_SCENARIOS = (Scenario.SERVER, Scenario.OFFLINE)


@dataclass(frozen=True)
class TokenBounds:
    """The p99 TTFT and TPOT bounds of a run, and where they came from."""

    ttft_s: float
    tpot_s: float
    source: str

    @classmethod
    def choose(cls, name: str | None, ttft_ms: float | None, tpot_ms: float | None) -> TokenBounds:
        """The user's bounds where given, else MLPerf's for `name` (default llama2-70b Server)."""
        key = (name or DEFAULT_BOUNDS).lower()
        if key not in MLPERF_TOKEN_BOUNDS:
            known = ", ".join(MLPERF_TOKEN_BOUNDS)
            raise BenchError(f"--mlperf-bounds {name!r}: expected one of {known}")
        ttft, tpot = MLPERF_TOKEN_BOUNDS[key]
        for given, flag in ((ttft_ms, "--ttft-ms"), (tpot_ms, "--tpot-ms")):
            if given is not None and not given > 0:
                raise BenchError(f"{flag} must be positive, not {given}")
        source = f"MLPerf {key}"
        if ttft_ms is not None or tpot_ms is not None:
            source = "--ttft-ms/--tpot-ms" + (
                f" (else MLPerf {key})" if None in (ttft_ms, tpot_ms) else ""
            )
        return cls(
            ttft_ms / 1e3 if ttft_ms is not None else ttft,
            tpot_ms / 1e3 if tpot_ms is not None else tpot,
            source,
        )


@dataclass(frozen=True)
class TokenRunSettings(RunSettings):
    """A LoadGen run with token latencies: RunSettings plus the TTFT and TPOT bounds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.2

    def to_loadgen(self, sample_count: int) -> Any:
        s = super().to_loadgen(sample_count)
        s.use_token_latencies = True
        s.ttft_latency = int(self.ttft_s * 1e9)
        s.tpot_latency = int(self.tpot_s * 1e9)
        s.server_target_latency_ns = s.ttft_latency
        return s

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "ttft_s": self.ttft_s, "tpot_s": self.tpot_s}


class TokenSut:
    """LoadGen's SUT: streams each issued sample, reporting its first token and its token count."""

    def __init__(
        self, client: StreamClient, jobs: list[Job], loop: LoopThread, concurrency: int
    ) -> None:
        self.client = client
        self.jobs = jobs
        self.loop = loop
        self.records: list[StreamRecord] = []
        self._concurrency = concurrency
        self._limit: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def issue_queries(self, queries: list[Any]) -> None:
        """LoadGen's callback (its thread): hand the samples to the event loop."""
        items = [(q.id, q.index) for q in queries]
        self.loop.loop.call_soon_threadsafe(self._dispatch, items)

    def flush_queries(self) -> None:
        """Nothing is held back."""

    def _dispatch(self, items: list[tuple[int, int]]) -> None:
        if self._concurrency and self._limit is None:
            self._limit = asyncio.Semaphore(self._concurrency)
        for query_id, index in items:
            task = asyncio.get_running_loop().create_task(self._send(query_id, index))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, query_id: int, index: int) -> None:
        job = self.jobs[index]
        first: list[np.ndarray] = []

        def on_first(record: StreamRecord) -> None:
            # LoadGen reads the bytes only in accuracy runs; they stay alive until the end.
            data = np.frombuffer(record.chunks[0].text.encode() or b"\0", dtype=np.uint8)
            first.append(data)
            ptr = data.__array_interface__["data"][0]
            lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, ptr, data.nbytes)])

        async with self._limit or contextlib.nullcontext():
            record = await self.client.stream(job.ask, on_first=on_first)
        record.input_tokens = job.input_tokens
        self.records.append(record)
        if not first:  # failed before any text: LoadGen still needs both calls, once each
            lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, 0, 0)])
        tokens = max(1, record.tokens) if record.ok else 1
        data = first[0] if first else np.zeros(1, dtype=np.uint8)
        ptr = data.__array_interface__["data"][0]
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, ptr, data.nbytes, tokens)])


def settings_for(
    scenario: Scenario,
    bounds: TokenBounds,
    *,
    duration_s: float,
    min_queries: int,
    target_qps: float | None,
    expected_qps: float,
    seed: int,
) -> TokenRunSettings:
    """The LoadGen settings of one generative scenario run."""
    if scenario not in TOKEN_SCENARIOS:
        raise BenchError(f"generative runs take --scenario server or offline, not {scenario}")
    return TokenRunSettings(
        scenario=scenario,
        duration_s=duration_s,
        min_query_count=min_queries,
        target_qps=target_qps,
        latency_bound_s=bounds.ttft_s,
        expected_qps=expected_qps,
        expected_latency_s=1.0 / expected_qps if expected_qps > 0 else None,
        seed=seed,
        ttft_s=bounds.ttft_s,
        tpot_s=bounds.tpot_s,
    )


def token_summary(folder: Path) -> dict[str, Any]:
    """LoadGen's verdict and reasons (lglog) plus its token figures: tokens/s, TTFT and TPOT."""
    fields = {
        key: figure
        for key, value in summary_of(folder)[0].items()
        if ("token" in key.lower() or "TTFT" in key or "TPOT" in key)
        and (figure := number(value)) is not None
    }
    return {**read_logs(folder), "token_fields": fields}
