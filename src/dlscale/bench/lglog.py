"""Reading LoadGen's own logs: the verdict, why, and its figures (mlperf_log_summary/detail)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from dlscale.bench.latency import PERCENTILES, percentile_name

#: Summary keys that hold LoadGen's throughput figure, by scenario (its own spellings).
_THROUGHPUT_KEYS = (
    "Samples per second",
    "Completed samples per second",
    "QPS w/ loadgen overhead",
)
#: The summary's latency keys (its spellings) of the percentiles every report gives.
_PERCENTILE_KEYS = {percentile_name(p): f"{p:.2f} percentile latency (ns)" for p in PERCENTILES}
_PERCENTILE_KEYS |= {k: f"{k.title()} latency (ns)" for k in ("mean", "min", "max")}


def read_logs(folder: Path) -> dict[str, Any]:
    """LoadGen's verdict and figures from the logs in `folder` (accuracy runs have fewer)."""
    fields, bullets = summary_of(folder)
    result = fields.get("Result is", "")
    reasons = [f"{k}: {v}" for k, v in fields.items() if k.endswith("satisfied") and v != "Yes"]
    throughput = next((number(fields[k]) for k in _THROUGHPUT_KEYS if k in fields), None)
    latency = {
        name: (v / 1e9 if (v := number(fields.get(key))) is not None else None)
        for name, key in _PERCENTILE_KEYS.items()
    }
    errors, warnings = _detail_issues(folder / "mlperf_log_detail.txt")
    metric_key = next((k for k in fields if k.endswith("th percentile latency (ns)")), None)
    metric: dict[str, Any] | None = None
    if metric_key is not None and (value := number(fields[metric_key])) is not None:
        metric = {"name": metric_key.replace(" (ns)", " (s)"), "value": value / 1e9}
    elif throughput is not None:
        metric = {"name": next(k for k in _THROUGHPUT_KEYS if k in fields), "value": throughput}
    return {
        "result": result or None,
        "metric": metric,
        "valid": result == "VALID",
        "reasons": reasons + [f"LoadGen error: {e}" for e in errors],
        "recommendations": bullets.get("Recommendations", []),
        "early_stopping": bullets.get("Early Stopping Result", []),
        "throughput": throughput,
        "scheduled_qps": number(fields.get("Scheduled samples per second")),
        "latency_s": latency,
        "errors": errors,
        "warnings": warnings,
    }


def summary_of(folder: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The summary's 'key : value' lines (a repeated key's first) and its bullets by section."""
    path = folder / "mlperf_log_summary.txt"
    fields: dict[str, str] = {}
    bullets: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines() if path.is_file() else ():
        line = raw.strip()
        if line.startswith("* "):
            bullets.setdefault(section, []).append(line[2:])
        elif line.endswith(":") and " : " not in line:
            section = line[:-1]
        elif ":" in line and not line.startswith("="):
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields, bullets


def _detail_issues(path: Path) -> tuple[list[str], list[str]]:
    errors: list[str] = []
    warnings: list[str] = []
    if not path.is_file():
        return errors, warnings
    for line in path.read_text().splitlines():
        if not line.startswith(":::MLLOG "):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG ") :])
        except ValueError:
            continue
        meta = entry.get("metadata", {})
        text = f"{entry.get('key')}: {entry.get('value')}"
        if meta.get("is_error"):
            errors.append(text)
        elif meta.get("is_warning"):
            warnings.append(text)
    return errors, warnings


def number(text: str | None) -> float | None:
    """The figure a summary value starts with, or None."""
    if text is not None:
        with contextlib.suppress(ValueError, IndexError):
            return float(text.split()[0])
    return None
