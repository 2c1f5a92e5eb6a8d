"""`dlscale bench URL --generative KIND ...`: the generative bench's flags into options; runs it."""

from __future__ import annotations

import argparse
import os

from dlscale.bench.generative.endpoints import Endpoint
from dlscale.bench.generative.load import MAX_IN_FLIGHT
from dlscale.bench.generative.mlperf import TOKEN_SCENARIOS, TokenBounds
from dlscale.bench.generative.options import GenerativeOptions, parse_list
from dlscale.bench.generative.prompts import Lengths
from dlscale.bench.generative.report import print_summary
from dlscale.bench.generative.runner import run_generative
from dlscale.bench.generative.statistics import Slo
from dlscale.bench.progress import Steps
from dlscale.bench.results import out_dir
from dlscale.bench.scenarios import Scenario, parse_duration
from dlscale.bench.sweep import parse_concurrency
from dlscale.errors import BenchError


def bench_generative(args: argparse.Namespace) -> int:
    """Run the generative bench the flags describe and print its summary."""
    options = generative_options(args)
    out = out_dir(args.out, f"{options.model.strip('/').replace('/', '_')}-generative")
    print_summary(run_generative(options, out, Steps(args.progress)))
    return 0


def generative_options(args: argparse.Namespace) -> GenerativeOptions:
    """GenerativeOptions from the parsed bench flags."""
    if len(args.targets) != 1:
        raise BenchError("a generative bench takes one target: http://HOST:PORT")
    if not args.model:
        raise BenchError("give the model to benchmark: --model NAME")
    bounds = TokenBounds.choose(args.mlperf_bounds, args.ttft_ms, args.tpot_ms)
    return GenerativeOptions(
        # host:port alone means plain HTTP, as aiperf's --url takes it.
        url=args.targets[0] if "://" in args.targets[0] else f"http://{args.targets[0]}",
        kind=Endpoint.parse(args.generative),
        model=args.model,
        isl=Lengths(args.isl, args.isl_stddev),
        osl=Lengths(args.osl, args.osl_stddev),
        tokenizer=args.tokenizer,
        requests=args.requests,
        warmup=args.warmup_requests,
        concurrency=_concurrency(args.concurrency),
        rates=parse_list(args.rate, float, "--rate"),
        trace=args.trace,
        trace_speedup=args.trace_speedup,
        scenarios=_scenarios(args.scenario),
        bounds=bounds,
        # Goodput counts requests within the user's bounds; none given, it is not computed.
        slo=Slo(
            args.ttft_ms / 1e3 if args.ttft_ms else None,
            args.tpot_ms / 1e3 if args.tpot_ms else None,
        ),
        duration_s=parse_duration(args.duration),
        target_qps=args.target_qps,
        min_queries=args.min_queries,
        seed=args.seed,
        # One connection per stream in flight: a pool smaller than the load would queue
        # requests in the client and count the wait as TTFT (--connections is the classic's).
        connections=max(args.connections, MAX_IN_FLIGHT),
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or None,
    )


def _concurrency(text: str | None) -> tuple[int, ...]:
    """`1,4,16`, or the classic bench's N and START:END[:STEP]."""
    if text and ":" in text:
        return parse_concurrency(text)[1]
    return parse_list(text, int, "--concurrency")


def _scenarios(text: str | None) -> tuple[Scenario, ...]:
    """LoadGen runs only when --scenario is given: server, offline, or all (both)."""
    if not text:
        return ()
    if text.lower() == "all":
        return TOKEN_SCENARIOS
    chosen = tuple(Scenario.parse(text))
    if any(s not in TOKEN_SCENARIOS for s in chosen):
        raise BenchError(f"--scenario {text}: a generative bench runs server or offline")
    return chosen
