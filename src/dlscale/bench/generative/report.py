"""A generative run's report: JSON (everything), Markdown, PNG plots and the terminal tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.bench import environment, sweep
from dlscale.bench.generative import plots
from dlscale.bench.generative.options import GenerativeOptions
from dlscale.bench.generative.records import StreamRecord
from dlscale.bench.render import fmt_ms, fmt_rate, markdown_table, rich_table
from dlscale.bench.report import make_console, write_json


def request_row(r: StreamRecord) -> dict[str, Any]:
    """One request's figures for the JSON (seconds; the send time from the run's clock)."""
    ttft, tpot, latency = r.ttft_ns, r.tpot_ns, r.latency_ns
    return {
        "sent_ns": r.sent_ns,
        "scheduled_s": r.scheduled_s,
        "ttft_s": ttft / 1e9 if ttft is not None else None,
        "tpot_s": tpot / 1e9 if tpot is not None else None,
        "latency_s": latency / 1e9 if latency is not None else None,
        "input_tokens": r.server_prompt_tokens or r.input_tokens,
        "output_tokens": r.tokens if r.ok else 0,
        "requested_tokens": r.requested_tokens,
        "token_source": r.token_source,
        "finish_reason": r.finish_reason,
        "error": r.error,
    }


def write(
    options: GenerativeOptions,
    points: list[dict[str, Any]],
    scenarios: list[dict[str, Any]],
    out: Path,
) -> dict[str, Any]:
    """report.json, report.md and the plots into `out`; the report as a dict."""
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "kind": "generative",
        "target": options.url,
        "endpoint": options.kind.value,
        "model": options.model,
        "options": options.to_dict(),
        "points": points,
        "loadgen": scenarios,
        "host": environment.host(),
        "packages": environment.packages(),
        "date": environment.now(),
        "files": {},
    }
    files = report["files"]
    files["tokens_png"] = _name(plots.plot_tokens(points, options, out / "tokens.png"))
    classic = [_as_sweep_point(options.url, p) for p in points if p["load"] == "concurrency"]
    files["concurrency_png"] = _name(sweep.plot(classic, None, out / "concurrency.png"))
    files["distribution_png"] = _name(plots.plot_distributions(points, out / "distribution.png"))
    files["json"] = str(out / "report.json")
    write_json(report, out / "report.json")
    (out / "report.md").write_text(markdown(report))
    return report


def _name(path: Path | None) -> str | None:
    return str(path) if path else None


def _as_sweep_point(target: str, p: dict[str, Any]) -> dict[str, Any]:
    """A concurrency point in the classic sweep's shape, so its plot draws requests/s against
    request latency (sweep.plot)."""
    return {
        "target": target,
        "sweep": "concurrency",
        "concurrency": p["concurrency"],
        "throughput_samples_per_s": p["requests_per_s"],
        "request_latency_s": p["latency"] if p["latency"]["p50"] is not None else None,
    }


COLUMNS = (
    "load", "ok/failed", "out tok/s", "req/s", "goodput/s",
    "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "TPOT p99", "ITL p50", "ITL p99",
)  # fmt: skip


def point_cells(p: dict[str, Any]) -> list[str]:
    """One point's row (times in ms)."""
    return [
        plots.label(p),
        f"{p['succeeded']}/{p['failed']}",
        fmt_rate(p["output_tokens_per_s"], 2),
        fmt_rate(p["requests_per_s"], 2),
        fmt_rate(p["goodput_per_s"], 2),
        *(fmt_ms(p["ttft"][k], 2) for k in ("p50", "p90", "p99")),
        *(fmt_ms(p["tpot"][k], 2) for k in ("p50", "p90", "p99")),
        *(fmt_ms(p["itl"][k], 2) for k in ("p50", "p99")),
    ]


def loadgen_cells(s: dict[str, Any]) -> list[str]:
    """One LoadGen run's row: verdict, LoadGen's tokens/s and its p99 TTFT and TPOT (ms)."""
    fields = s["loadgen"]["token_fields"]
    tps = next((v for k, v in fields.items() if k.lower().endswith("tokens per second")), None)
    ttft = fields.get("99.00 percentile first token latency (ns)")
    tpot = fields.get("99.00 percentile time to output token (ns)")
    return [
        s["scenario"],
        s["verdict"],
        fmt_rate(tps, 2),
        fmt_ms(ttft / 1e9 if ttft is not None else None, 2),
        fmt_ms(tpot / 1e9 if tpot is not None else None, 2),
        fmt_rate(s["bench"]["output_tokens_per_s"], 2),
    ]


LOADGEN_COLUMNS = ("scenario", "verdict", "tokens/s", "TTFT p99", "TPOT p99", "bench tok/s")


def print_summary(report: dict[str, Any]) -> None:
    """The points' table, LoadGen's verdicts and reasons, where the report went."""
    console = make_console()
    if report["points"]:
        title = f"dlscale bench {report['endpoint']}: {report['model']} (times in ms)"
        console.print(rich_table(title, COLUMNS, map(point_cells, report["points"]), ("load",)))
    if report["loadgen"]:
        title = "MLPerf LoadGen with token latencies (times in ms)"
        cells = map(loadgen_cells, report["loadgen"])
        console.print(rich_table(title, LOADGEN_COLUMNS, cells, ("scenario", "verdict")))
        for s in report["loadgen"]:
            for reason in s["reasons"]:
                console.print(f"[red]{s['scenario']}[/]: {reason}")
    console.print(f"report: {report['files'].get('json')}")


def markdown(report: dict[str, Any]) -> str:
    """report.md: the same tables, the settings, the plots."""
    o = report["options"]
    lines = [
        f"# dlscale bench {report['endpoint']}: {report['model']}",
        "",
        f"Target {report['target']}, {report['date']}. ISL {o['isl']}, OSL {o['osl']}, "
        f"{o['requests']} requests per point, SLO {o['slo']}. Times in ms.",
        "",
    ]
    if report["points"]:
        lines += markdown_table(COLUMNS, map(point_cells, report["points"]), COLUMNS)
    if report["loadgen"]:
        cells = map(loadgen_cells, report["loadgen"])
        lines += ["", *markdown_table(LOADGEN_COLUMNS, cells, LOADGEN_COLUMNS)]
        lines += [f"- {s['scenario']}: {r}" for s in report["loadgen"] for r in s["reasons"]]
    for key, path in report["files"].items():
        if key.endswith("_png") and path:
            lines += ["", f"![{key}]({Path(path).name})"]
    return "\n".join(lines) + "\n"
