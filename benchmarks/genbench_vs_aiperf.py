"""dlscale's generative bench against NVIDIA's aiperf: the same endpoint, the same load.

    python -m benchmarks.genbench_vs_aiperf [--url http://HOST:PORT --model M[,M] --tokenizer DIR]
        [--kind openai|chat] [--concurrency 4] [--isl 128] [--osl 64] [--requests 64]
        [--rounds 3] [--no-ignore-eos]

Without --url it starts `dlscale serve` (its OpenAI routes) on two models and measures each:
the zoo's llama-tiny on the transformers backend (CPU-bound: on a small host the client's own
CPU use slows it) and `paced` (benchmarks/harness/paced.py: tokens 20 ms, then every 10 ms,
asleep in between, so the endpoint's pace does not depend on the client). Each round runs
aiperf 0.13.0 (its own venv, .bench/aiperf-venv; offline with `--tokenizer <llama-tiny's
folder>` and the server's token counts) and `dlscale bench --generative` one after the other,
in alternating order, with the same concurrency, ISL/OSL, request count and warm-up. It prints
the medians over rounds of TTFT (p50, p99), TPOT (p50: aiperf's "inter token latency" is the
same formula) and output tokens/s for both, with their ratio and whether it is within 10%, and
each run's client CPU seconds; everything goes to bench-results/genbench_vs_aiperf-DATE.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import aiperf
from benchmarks.harness.paced import write_paced
from benchmarks.harness.servers import (
    RESULTS,
    WORK,
    ServerProcess,
    free_port,
    serve_argv,
    thread_env,
    wait_ready,
)
from benchmarks.harness.statistics import machine
from dlscale.bench.generative.endpoints import Endpoint
from dlscale.bench.generative.options import GenerativeOptions
from dlscale.bench.generative.prompts import Lengths
from dlscale.bench.generative.runner import run_generative

#: The figures both benches give, and the share within which they should agree.
FIGURES = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "output_tokens_per_s")
AGREEMENT = 0.10
ZOO_MODEL = "llama-tiny"
#: A model whose tokens come at a steady pace (benchmarks/harness/paced.py): 20 ms, then 10 ms.
PACED_MODEL = "paced"


def dlscale_run(load: aiperf.TokenLoad, out: Path) -> dict[str, Any]:
    """`dlscale bench --generative` once, through its Python API, with `load`."""
    options = GenerativeOptions(
        url=load.url,
        kind=Endpoint.parse(load.kind),
        model=load.model,
        isl=Lengths(load.isl),
        osl=Lengths(load.osl),
        tokenizer=load.tokenizer,
        requests=load.requests,
        warmup=load.warmup,
        concurrency=(load.concurrency,),
        seed=load.seed,
        ignore_eos=load.ignore_eos,
    )
    cpu = time.process_time()
    point = run_generative(options, out, say=lambda line: None)["points"][0]
    cpu = time.process_time() - cpu
    return {
        "ttft_p50_s": point["ttft"]["p50"],
        "ttft_p99_s": point["ttft"]["p99"],
        "ttft_mean_s": point["ttft"]["mean"],
        "tpot_p50_s": point["tpot"]["p50"],
        "tpot_mean_s": point["tpot"]["mean"],
        "latency_p50_s": point["latency"]["p50"],
        "output_tokens_per_s": point["output_tokens_per_s"],
        "requests_per_s": point["requests_per_s"],
        "output_tokens": point["output_tokens"],
        "requests": point["succeeded"],
        "client_cpu_s": cpu,
    }


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median of each figure per bench, and dlscale's over aiperf's."""
    out = []
    for figure in FIGURES:
        medians = {
            bench: statistics.median(r[figure] for r in rows if r["bench"] == bench)
            for bench in ("aiperf", "dlscale")
        }
        ratio = medians["dlscale"] / medians["aiperf"] if medians["aiperf"] else None
        within = ratio is not None and abs(ratio - 1) <= AGREEMENT
        out.append({"figure": figure, **medians, "ratio": ratio, "within_10pct": within})
    return out


def markdown(comparison: list[dict[str, Any]]) -> str:
    lines = [
        "| figure | aiperf | dlscale | dlscale / aiperf | within 10% |",
        "|---|---|---|---|---|",
    ]
    for c in comparison:
        seconds = c["figure"].endswith("_s") and not c["figure"].endswith("per_s")
        scale, unit = (1e3, " ms") if seconds else (1.0, "/s")
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.3f}"
        lines.append(
            f"| {c['figure']} | {c['aiperf'] * scale:.2f}{unit} | {c['dlscale'] * scale:.2f}{unit}"
            f" | {ratio} | {'yes' if c['within_10pct'] else 'NO'} |"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def zoo_server() -> Iterator[tuple[str, Path]]:
    """`dlscale serve` on a repository holding the zoo's llama-tiny and the paced model: its URL
    and llama-tiny's Hugging Face folder (both benches' tokenizer)."""
    from dlscale.models.zoo import build_zoo

    repo = WORK / "genbench-repo"
    if not (repo / ZOO_MODEL).is_dir():
        build_zoo(repo, (ZOO_MODEL,))
    write_paced(repo, PACED_MODEL)
    http = free_port()
    proc = subprocess.Popen(
        [*serve_argv(repo, http, free_port()), "--log-level", "WARNING"],
        env=thread_env(),
        start_new_session=True,
        text=True,
    )
    server = ServerProcess("dlscale", proc, http)
    try:
        wait_ready(server, [f"/v2/models/{m}/ready" for m in (ZOO_MODEL, PACED_MODEL)])
        yield f"http://127.0.0.1:{http}", repo / ZOO_MODEL / "1"
    finally:
        server.stop()


def measure(load: aiperf.TokenLoad, rounds: int, work: Path) -> list[dict[str, Any]]:
    """`rounds` runs of each bench, alternating which goes first."""
    rows = []
    for i in range(rounds):
        order = ("aiperf", "dlscale") if i % 2 == 0 else ("dlscale", "aiperf")
        for bench in order:
            out = work / f"{bench}-{i}"
            run = aiperf.run_aiperf if bench == "aiperf" else dlscale_run
            row = {"bench": bench, "round": i, **run(load, out)}
            print("  " + json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="an OpenAI endpoint (default: dlscale serve, the zoo's models)")
    p.add_argument("--model", help=f"models, comma-separated (default {ZOO_MODEL},{PACED_MODEL})")
    p.add_argument("--tokenizer", type=Path, help="the model's folder (default: llama-tiny's)")
    p.add_argument("--kind", default="openai", choices=["openai", "chat"])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--isl", type=int, default=128)
    p.add_argument("--osl", type=int, default=64)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    aiperf.ensure_aiperf()
    results = []
    with contextlib.ExitStack() as stack:
        url, tokenizer = args.url, args.tokenizer
        if url is None:
            url, tokenizer = stack.enter_context(zoo_server())
        if tokenizer is None:
            p.error("--tokenizer DIR is needed with --url")
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="genbench-")))
        for model in (args.model or f"{ZOO_MODEL},{PACED_MODEL}").split(","):
            load = aiperf.TokenLoad(
                url, args.kind, model, tokenizer, args.concurrency, args.isl, args.osl,
                args.requests, ignore_eos=args.ignore_eos,
            )  # fmt: skip
            print(f"{model}: {args.rounds} rounds of aiperf and dlscale bench", flush=True)
            rows = measure(load, args.rounds, work / model)
            comparison = compare(rows)
            print(markdown(comparison), flush=True)
            load_doc = {**load.__dict__, "tokenizer": str(load.tokenizer)}
            results.append({"load": load_doc, "rows": rows, "comparison": comparison})
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"genbench_vs_aiperf-{time.strftime('%Y%m%d-%H%M%S')}.json"
    summary = {"aiperf_version": aiperf.aiperf_version(), "models": results, "machine": machine()}
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"written: {path}")


if __name__ == "__main__":
    main()
