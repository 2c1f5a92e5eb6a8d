"""What OTLP tracing costs: the same server and load with tracing off, on at the default rate
(one request in 1000), and on for every request.

    python -m benchmarks.otlp_traces [--repeats 5] [--duration 4] [--streams 16]

Each repetition starts `dlscale serve` once per setting (in turn, so that they share the
machine's drift) and drives identity FP32 [1, 16] JSON with the project's closed-loop client
(benchmarks/harness/clients.py), every request carrying a W3C `traceparent`; the spans go to
an OTLP/HTTP receiver in this process (benchmarks/harness/otlp.py). Printed: the median
throughput and p50 per setting, and the median over repetitions of each setting's throughput
over tracing off's in the same repetition. Results go to bench-results/otlp-traces-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.clients import build_request, closed_loop
from benchmarks.harness.models import SMALL, build_large_repository
from benchmarks.harness.otlp import Received, otlp_receiver
from benchmarks.harness.servers import HOST, RESULTS, start_dlscale
from benchmarks.harness.statistics import machine, median_table, paired_ratios, record

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#: setting -> the flags it adds to `dlscale serve` ({url}: the receiver's endpoint).
SETTINGS: dict[str, tuple[str, ...]] = {
    "off": (),
    "otlp rate 1000": ("--otlp-traces-endpoint", "{url}"),
    "otlp rate 1": ("--otlp-traces-endpoint", "{url}", "--trace-rate", "1"),
}


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
        result = asyncio.run(closed_loop(HOST, port, wire, args.streams, args.duration))
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
        )
    finally:
        server.stop()


def main() -> None:
    """Run the settings in turn, print medians and paired ratios against tracing off."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--streams", type=int, default=16)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder, otlp_receiver() as receiver:
        repo = build_large_repository(Path(folder))
        for rep in range(args.repeats):
            print(f"repetition {rep + 1}/{args.repeats}", flush=True)
            for setting in SETTINGS:
                run_once(repo, setting, rep, args, receiver, rows)
        received = {"exports": receiver.exports, "spans": receiver.spans}
    table = median_table(rows, "otlp-traces")
    for row in table:
        print(json.dumps(row))
    ratios = {}
    for setting in list(SETTINGS)[1:]:
        paired = paired_ratios(rows, "throughput", setting, "off")
        ratios[setting] = round(statistics.median(paired), 4) if paired else None
        print(f"{setting}: throughput x{ratios[setting]} of tracing off (median of {paired})")
    print(f"receiver: {received}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"otlp-traces-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {"machine": machine(), "rows": rows, "medians": table, "ratios": ratios}
    out.write_text(json.dumps({**report, "received": received}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
