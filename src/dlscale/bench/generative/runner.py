"""A generative bench run: warm up, then each concurrency, rate and trace point, then LoadGen.

Everything on the wire happens on one asyncio loop in a thread of its own (`LoopThread`, as the
classic bench does), so that LoadGen can block the calling thread while streams run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

from dlscale.bench.generative import report
from dlscale.bench.generative.client import StreamClient
from dlscale.bench.generative.endpoints import Ask
from dlscale.bench.generative.load import Job, closed_loop, open_loop, poisson_offsets
from dlscale.bench.generative.mlperf import TokenSut, settings_for, token_summary
from dlscale.bench.generative.options import GenerativeOptions
from dlscale.bench.generative.prompts import PromptMaker, synthetic_asks
from dlscale.bench.generative.records import StreamRecord
from dlscale.bench.generative.statistics import summarize_run
from dlscale.bench.generative.tokens import TokenCounter
from dlscale.bench.generative.trace import read_trace, trace_asks
from dlscale.bench.loadgen import LoopThread, run_loadgen
from dlscale.bench.progress import Countdown
from dlscale.bench.scenarios import Scenario
from dlscale.bench.session import EARLY_STOPPING_QUERIES, SIZING_RERUNS, sized_up
from dlscale.errors import BenchError

Say = Callable[[str], None]
#: The probe that sizes LoadGen's runs when no sweep point did.
PROBE_REQUESTS = 16
PROBE_CONCURRENCY = 4


def run_generative(options: GenerativeOptions, out: Path, say: Say) -> dict[str, Any]:
    """Run every load the options ask for and write the report into `out`."""
    counter = TokenCounter(options.tokenizer) if options.tokenizer else None
    maker = PromptMaker(counter, options.seed)
    made = synthetic_asks(maker, options.requests, options.isl, options.osl)
    jobs = [Job(_knobs(ask, options), tokens) for ask, tokens in made]
    trace = read_trace(options.trace) if options.trace else None
    client = StreamClient(
        options.url,
        options.kind,
        options.model,
        connections=options.connections,
        counter=counter,
        api_key=options.api_key,
    )
    with closing(LoopThread()) as loop:
        try:
            loop.run(client.__aenter__())
            rate = _warm_up(loop, client, jobs, options, say)
            points = _sweep(loop, client, jobs, options, say)
            if trace is not None:
                say(f"trace replay: {len(trace)} requests from {options.trace}")
                timed = [
                    Job(_knobs(a, options), n, t / options.trace_speedup)
                    for a, n, t in trace_asks(trace, maker)
                ]
                with Countdown("trace replay", len(timed)) as countdown:
                    records = loop.run(open_loop(client, timed, countdown.done))
                points.append(_point("trace", None, records, options))
            best = max([rate, *(p["requests_per_s"] or 0.0 for p in points)])
            scenarios = [
                _loadgen(loop, client, jobs, options, scenario, best, out, say)
                for scenario in options.scenarios
            ]
        finally:
            loop.run(client.__aexit__())
    say("writing the report")
    return report.write(options, points, scenarios, out)


def _knobs(ask: Ask, options: GenerativeOptions) -> Ask:
    """The run's sampling knobs on a request (one place for every load)."""
    return replace(ask, ignore_eos=options.ignore_eos, temperature=options.temperature)


def _warm_up(
    loop: LoopThread,
    client: StreamClient,
    jobs: list[Job],
    options: GenerativeOptions,
    say: Say,
) -> float:
    """A few streams first (not measured); fails early on an endpoint that does not answer.
    When LoadGen runs next, a short probe at a few streams in flight then gives the rate it
    expects (requests/s)."""
    count = max(1, options.warmup)
    say(f"warm-up: {count} requests to {options.url} ({options.kind.value})")
    warm = [jobs[i % len(jobs)] for i in range(count)]
    records = loop.run(closed_loop(client, warm, min(count, max(options.loads or (1,)))))
    failed = [r for r in records if not r.ok]
    if len(failed) == len(records):
        raise BenchError(f"the endpoint did not stream an answer: {failed[0].error}")
    if not options.scenarios or options.loads:
        return summarize_run(records).requests_per_s or 1.0
    probe = jobs[: min(len(jobs), PROBE_REQUESTS)]
    say(f"probe: {len(probe)} requests, {PROBE_CONCURRENCY} in flight (LoadGen's expected rate)")
    return (
        summarize_run(loop.run(closed_loop(client, probe, PROBE_CONCURRENCY))).requests_per_s or 1.0
    )


def _sweep(
    loop: LoopThread,
    client: StreamClient,
    jobs: list[Job],
    options: GenerativeOptions,
    say: Say,
) -> list[dict[str, Any]]:
    points = []
    for concurrency in options.loads:
        say(f"concurrency {concurrency}: {len(jobs)} requests")
        with Countdown(f"concurrency {concurrency}", len(jobs)) as countdown:
            records = loop.run(closed_loop(client, jobs, concurrency, countdown.done))
        points.append(_point("concurrency", concurrency, records, options))
    for i, rate in enumerate(options.rates):
        say(f"rate {rate:g}/s: {len(jobs)} requests, Poisson arrivals")
        offsets = poisson_offsets(len(jobs), rate, options.seed + i)
        timed = [Job(j.ask, j.input_tokens, t) for j, t in zip(jobs, offsets, strict=True)]
        with Countdown(f"rate {rate:g}/s", len(timed)) as countdown:
            records = loop.run(open_loop(client, timed, countdown.done))
        points.append(_point("rate", rate, records, options))
    return points


def _point(
    load: str, value: float | None, records: list[StreamRecord], options: GenerativeOptions
) -> dict[str, Any]:
    stats = summarize_run(records, options.slo)
    return {
        "load": load,
        "concurrency": value if load == "concurrency" else None,
        "rate": value if load == "rate" else None,
        **stats.to_dict(),
        "requests_detail": [report.request_row(r) for r in records],
    }


def _loadgen(
    loop: LoopThread,
    client: StreamClient,
    jobs: list[Job],
    options: GenerativeOptions,
    scenario: Scenario,
    rate: float,
    out: Path,
    say: Say,
) -> dict[str, Any]:
    """One LoadGen run with token latencies; its own summary and the bench's figures. An
    Offline run that ends before its minimum duration is run again, sized up (as the classic
    bench does)."""
    target_qps = options.target_qps
    if scenario is Scenario.SERVER and target_qps is None:
        target_qps = rate / 2  # half of what the loads reached, so the queue stays short
    minimum = options.min_queries or len(jobs)
    if scenario is Scenario.SERVER and options.min_queries is None:
        # Enough for LoadGen's early-stopping estimate of the p99 TTFT and TPOT.
        minimum = max(minimum, EARLY_STOPPING_QUERIES[Scenario.SERVER])
    concurrency = max(options.concurrency, default=0) if scenario is Scenario.OFFLINE else 0
    log_dir = out / "loadgen" / scenario.value
    result: dict[str, Any] = {}
    for attempt in range(1 + SIZING_RERUNS):
        settings = settings_for(
            scenario,
            options.bounds,
            duration_s=options.duration_s,
            min_queries=minimum,
            target_qps=target_qps,
            expected_qps=rate,
            seed=options.seed,
        )
        sut = TokenSut(client, jobs, loop, concurrency)
        qps = f" at {target_qps:.3g}/s" if scenario is Scenario.SERVER else ""
        say(f"LoadGen {scenario.loadgen_name}{qps}" + (" (again, resized)" if attempt else ""))
        run_loadgen(sut, len(jobs), settings, log_dir)
        result = _loadgen_result(scenario, settings.to_dict(), sut, options, log_dir)
        reached = result["bench"]["requests_per_s"]
        short = any(r.startswith("Min duration satisfied") for r in result["reasons"])
        if scenario is not Scenario.OFFLINE or not short or not reached:
            break
        rate = sized_up(rate, reached) or rate
    return result


def _loadgen_result(
    scenario: Scenario,
    settings: dict[str, Any],
    sut: TokenSut,
    options: GenerativeOptions,
    log_dir: Path,
) -> dict[str, Any]:
    stats = summarize_run(sut.records, options.slo)
    summary = token_summary(log_dir)
    errors = []
    if stats.failed:
        first = stats.first_errors[0] if stats.first_errors else "no message"
        errors.append(f"{stats.failed} requests failed (first: {first})")
    valid = bool(summary["valid"]) and not errors
    return {
        "scenario": scenario.loadgen_name,
        "settings": settings,
        "valid": valid,
        "verdict": "VALID" if valid else "INVALID",
        "reasons": summary["reasons"] + errors,
        "loadgen": summary,
        "bench": stats.to_dict(),
        "log_dir": str(log_dir),
    }
