"""What OTLP tracing costs: the same server and load with tracing off, on at the default rate
(one request in 1000), and on for every request.

    python -m benchmarks.otlp_traces [--repeats 5] [--duration 4] [--streams 16]
                                     [--tracer-requests 20000] [--skip-served]

Each repetition starts `dlscale serve` once per setting (in turn, so that they share the
machine's drift) and drives identity FP32 [1, 16] JSON with the project's closed-loop client
(benchmarks/harness/clients.py), every request carrying a W3C `traceparent`; the spans go to
an OTLP/HTTP receiver in this process (benchmarks/harness/otlp.py). Printed: the median
throughput and p50 per setting, and the median over repetitions of each setting's throughput
over tracing off's in the same repetition, and the same ratio of the server's CPU time per
answered request (less shaken than the throughput by other jobs on the machine). Results go
to bench-results/otlp-traces-*.json.

A second part measures what tracing adds where it is paid, without the network, the client
or the batches' size moving with the load: the CPU time per request of the Tracer's path alone
(its start for every request; for the sampled, the spans built, queued and serialized for the
receiver), each setting in turn per repetition, medians. Set against the served CPU per request
of the first part, it gives the share of a request's CPU that tracing takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.harness.clients import build_request, closed_loop
from benchmarks.harness.models import SMALL, build_large_repository
from benchmarks.harness.otlp import Received, otlp_receiver
from benchmarks.harness.servers import HOST, RESULTS, cpu_seconds, start_dlscale
from benchmarks.harness.statistics import machine, median_table, paired_ratios, record
from dlscale.serving.observe.otel import OtlpSink
from dlscale.serving.observe.stats import RequestTimes
from dlscale.serving.observe.trace import Tracer, TraceSettings

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#: setting -> the flags it adds to `dlscale serve` ({url}: the receiver's endpoint).
SETTINGS: dict[str, tuple[str, ...]] = {
    "off": (),
    "otlp rate 1000": ("--otlp-traces-endpoint", "{url}"),
    "otlp rate 1": ("--otlp-traces-endpoint", "{url}", "--trace-rate", "1"),
}


def answered(port: int) -> int:
    """Requests the server has answered so far (its statistics extension)."""
    url = f"http://{HOST}:{port}/v2/models/{SMALL.name}/stats"
    with urllib.request.urlopen(url, timeout=10) as answer:
        stats = json.load(answer)["model_stats"][0]["inference_stats"]
    return int(stats["success"]["count"])


def run_once(
    repo: Path,
    setting: str,
    rep: int,
    args: argparse.Namespace,
    receiver: Received,
    rows: list[dict[str, Any]],
) -> None:
    """Start a server with `setting`, measure it, stop it."""
    flags = tuple(f.replace("{url}", receiver.endpoint) for f in SETTINGS[setting])
    server, port, _ = start_dlscale(repo, [SMALL.name], flags)
    try:
        wire = build_request(
            HOST, port, f"/v2/models/{SMALL.name}/infer", SMALL.json_body(),
            {"traceparent": TRACEPARENT},
        )  # fmt: skip
        spans_before = receiver.spans
        served, cpu = answered(port), cpu_seconds(server.proc.pid)
        result = asyncio.run(closed_loop(HOST, port, wire, args.streams, args.duration))
        cpu, served = cpu_seconds(server.proc.pid) - cpu, answered(port) - served
        latencies = sorted(result.latencies_s)
        record(
            rows,
            bench="otlp-traces",
            server=setting,
            model=SMALL.name,
            concurrency=args.streams,
            rep=rep,
            throughput=result.throughput,
            p50_ms=1000 * statistics.median(latencies) if latencies else 0.0,
            p99_ms=1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
            errors=result.errors,
            requests=len(latencies),
            spans_while_measured=receiver.spans - spans_before,
            # The server's CPU per answered request (warm-up included): steadier than the
            # throughput on a machine that others share.
            cpu_us_per_request=1e6 * cpu / served if served else 0.0,
        )
    finally:
        server.stop()


#: The tracer's part: setting -> (OTLP on, trace rate).
TRACER: dict[str, tuple[bool, int]] = {
    "off": (False, 1000),
    "otlp rate 1000": (True, 1000),
    "otlp rate 1": (True, 1),
}


def tracer_us(endpoint: str, otlp: bool, rate: int, requests: int) -> float:
    """The CPU time (µs) per request of what tracing adds to a request's path: the Tracer's
    start and, for those sampled, the spans made, queued and sent (the flush at the end runs
    the export in this thread, so its serialization counts too)."""
    sink = OtlpSink(endpoint) if otlp else None
    level = "TIMESTAMPS" if otlp else "OFF"
    tracer = Tracer(None, TraceSettings(level, rate), sink)
    start = time.process_time()
    for _ in range(requests):
        now = time.perf_counter_ns()
        trace = tracer.start(SMALL.name, 1, "", TRACEPARENT)
        if trace is not None:
            times = RequestTimes(now, now + 1, now + 2, now + 3, now + 4, now + 5, now + 6, 1)
            tracer.finish(trace, times)
    if sink is not None:
        sink.flush()
    spent = time.process_time() - start
    tracer.flush()
    return 1e6 * spent / requests


def run_tracer(args: argparse.Namespace, receiver: Received) -> dict[str, Any]:
    """Each setting in turn per repetition: the tracer's CPU per request, medians."""
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        for setting, (otlp, rate) in TRACER.items():
            us = tracer_us(receiver.endpoint, otlp, rate, args.tracer_requests)
            record(rows, bench="otlp-tracer", server=setting, rep=rep, cpu_us_per_request=us)
    summary = {
        setting: round(
            statistics.median(r["cpu_us_per_request"] for r in rows if r["server"] == setting), 3
        )
        for setting in TRACER
    }
    print(f"the tracer's CPU per request, µs: {summary}")
    return {"rows": rows, "cpu_us_per_request": summary}


def main() -> None:
    """Run the settings in turn, print medians and paired ratios against tracing off."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tracer-requests", type=int, default=20_000)
    parser.add_argument("--skip-served", action="store_true", help="the in-process part only")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder, otlp_receiver() as receiver:
        repo = build_large_repository(Path(folder))
        for rep in range(0 if args.skip_served else args.repeats):
            print(f"repetition {rep + 1}/{args.repeats}", flush=True)
            for setting in SETTINGS:
                run_once(repo, setting, rep, args, receiver, rows)
        tracer = run_tracer(args, receiver)
        received = {"exports": receiver.exports, "spans": receiver.spans}
    table = median_table(rows, "otlp-traces")
    for row in table:
        print(json.dumps(row))
    ratios: dict[str, dict[str, float | None]] = {}
    for setting in list(SETTINGS)[1:]:
        ratios[setting] = {}
        for key in ("throughput", "cpu_us_per_request"):
            paired = paired_ratios(rows, key, setting, "off")
            ratio = round(statistics.median(paired), 4) if paired else None
            ratios[setting][key] = ratio
            shown = [round(r, 3) for r in paired]
            print(f"{setting}: {key} x{ratio} of tracing off (median of {shown})")
    print(f"receiver: {received}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"otlp-traces-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {
        "machine": machine(),
        "rows": rows,
        "medians": table,
        "ratios": ratios,
        "tracer": tracer,
    }
    out.write_text(json.dumps({**report, "received": received}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
