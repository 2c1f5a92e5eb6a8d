"""The interference report: medians and ratios over repetitions, as JSON, Markdown and a PNG."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dlscale.bench import environment
from dlscale.bench.interference import InterferenceOptions, Phase, Setup
from dlscale.bench.render import fmt, fmt_ms, fmt_rate, markdown_table, pyplot, rich_table, save
from dlscale.bench.report import make_console, write_json

#: The issue's targets with the scheduler on: the protected p99 at most this times its p99
#: alone, and the neighbor keeping at least this share of its rate alone, less the protected
#: tenant's share of the device.
P99_RATIO_TARGET = 1.2
NEIGHBOR_KEPT_TARGET = 0.8
#: Each condition's baseline: the phase measured alone in the same repetition.
BASELINE = {"mig": "mig alone"}


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _find(phases: Sequence[Phase], condition: str, repetition: int) -> Phase | None:
    return next(
        (p for p in phases if p.condition == condition and p.repetition == repetition), None
    )


def _share(alone: Phase) -> float | None:
    """The protected tenant's share of the device alone: its batches' time over the run's."""
    if alone.protected_device_s is None or not alone.duration_s:
        return None
    return min(1.0, alone.protected_device_s / alone.duration_s)


def summarize(phases: Sequence[Phase], objective_s: float | None) -> dict[str, Any]:
    """Per condition, medians over repetitions of the figures and of each repetition's ratios.

    `within_objective`: the runs whose protected p99 held the objective (LoadGen's own verdict
    asks for its early-stopping estimate too, which a short run at a modest rate cannot meet;
    it stays in report.json as `valid`).
    """
    repetitions = sorted({p.repetition for p in phases})
    names = list(dict.fromkeys(p.condition for p in phases))
    out: dict[str, Any] = {"conditions": []}
    for name in names:
        mine = [p for p in phases if p.condition == name]
        row: dict[str, Any] = {
            "condition": name,
            "runs": len(mine),
            "within_objective": sum(
                p.p99_s is not None and objective_s is not None and p.p99_s <= objective_s
                for p in mine
            ),
            "protected_p99_s": _median([p.p99_s for p in mine]),
            "protected_throughput": _median([p.throughput for p in mine]),
            "neighbor_rate": _median([p.neighbor_rate for p in mine]),
        }
        if name in ("alone", "mig alone"):
            row["protected_share"] = _median([_share(p) for p in mine])
        else:
            row.update(_ratios(phases, name, repetitions))
        out["conditions"].append(row)
    return out


def _ratios(phases: Sequence[Phase], name: str, repetitions: list[int]) -> dict[str, Any]:
    p99_ratios, kept = [], []
    for r in repetitions:
        phase, alone = _find(phases, name, r), _find(phases, BASELINE.get(name, "alone"), r)
        if phase is None or alone is None:
            continue
        if phase.p99_s and alone.p99_s:
            p99_ratios.append(phase.p99_s / alone.p99_s)
        share = _share(alone)
        if phase.neighbor_rate is not None and alone.neighbor_rate and share is not None:
            kept.append(phase.neighbor_rate / (alone.neighbor_rate * (1 - share)))
    ratio, keep = _median(p99_ratios), _median(kept)
    out: dict[str, Any] = {
        "p99_ratio": ratio,
        "p99_ratios": p99_ratios,
        "neighbor_kept": keep,
        "neighbor_kept_each": kept,
    }
    if name in ("on", "mig", "served") and ratio is not None and keep is not None:
        out["meets_targets"] = ratio <= P99_RATIO_TARGET and keep >= NEIGHBOR_KEPT_TARGET
    return out


def build_report(
    options: InterferenceOptions, setup: Setup, phases: list[Phase], rate: float
) -> dict[str, Any]:
    """Everything measured, with the run's settings and the machine it ran on."""
    first = setup.conditions[0]
    info = first.protected.info
    batch, concurrency = first.neighbor.offline_shape()
    return {
        "format": "dlscale-bench-interference/1",
        "date": environment.now(),
        "protected": {
            "model": options.protected,
            "rate": rate,
            "objective_s": setup.objective_s,
            "objective_source": setup.objective_source,
            "platform": info.platform if info else None,
        },
        "neighbor": {"model": options.neighbor, "batch": batch, "concurrency": concurrency},
        "targets": {"p99_ratio": P99_RATIO_TARGET, "neighbor_kept": NEIGHBOR_KEPT_TARGET},
        "conditions": [t.condition for t in setup.conditions],
        "repeats": options.repeats,
        "duration_s": options.duration_s,
        "notes": setup.notes,
        "phases": [p.to_dict() for p in phases],
        "summary": summarize(phases, setup.objective_s),
        "device": environment.device_name(
            s.info for t in setup.conditions for s in (t.protected, t.neighbor)
        ),
        "host": environment.host(),
        "packages": environment.packages(),
    }


def write(report: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """report.json, report.md and interference.png in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out_dir / "report.json"), "markdown": str(out_dir / "report.md")}
    png = plot(report, out_dir / "interference.png")
    if png is not None:
        files["png"] = str(png)
    report["files"] = files
    write_markdown(report, out_dir / "report.md")
    write_json(report, out_dir / "report.json")
    return report


def _cells(row: dict[str, Any]) -> list[str]:
    meets = row.get("meets_targets")
    return [
        row["condition"],
        fmt_ms(row["protected_p99_s"], 2),
        fmt(row.get("p99_ratio"), ".2f"),
        fmt_rate(row["protected_throughput"]),
        fmt_rate(row["neighbor_rate"]),
        fmt(row.get("neighbor_kept"), ".2f"),
        fmt(row.get("protected_share"), ".1%"),
        f"{row['within_objective']}/{row['runs']}",
        "-" if meets is None else ("yes" if meets else "no"),
    ]


HEADERS = [
    "condition", "protected p99 ms", "p99 / alone", "protected req/s", "neighbor rows/s",
    "neighbor kept", "protected share", "p99 <= objective", "targets met",
]  # fmt: skip


def write_markdown(report: dict[str, Any], path: Path) -> Path:
    """The table of medians, the settings and the notes, for people."""
    p, n = report["protected"], report["neighbor"]
    objective = "-" if p["objective_s"] is None else f"{p['objective_s'] * 1e3:g} ms"
    loads = [x["load_average"] for x in report["phases"] if x.get("load_average") is not None]
    load = f"{min(loads):.1f} to {max(loads):.1f}" if loads else "-"
    lines = [
        f"# dlscale bench interference: {p['model']} beside {n['model']}",
        "",
        f"- date: {report['date']}; device: {report['device']}; host load average at the end "
        f"of each phase: {load}",
        f"- protected: {p['model']} at {p['rate']:g} requests/s (LoadGen Server), p99 objective "
        f"{objective} ({p['objective_source']})",
        f"- neighbor: {n['model']}, a closed loop of {n['concurrency']} requests of {n['batch']} "
        "row(s)",
        f"- {report['repeats']} repetitions of {report['duration_s']:g} s per phase; medians; "
        "ratios are each repetition's against the same repetition's alone phase",
        f"- targets (scheduler on): p99 / alone <= {report['targets']['p99_ratio']}, neighbor "
        f"kept >= {report['targets']['neighbor_kept']} of (its rate alone x (1 - protected "
        "share))",
        "",
        *markdown_table(HEADERS, map(_cells, report["summary"]["conditions"]), ("condition",)),
        "",
    ]
    lines += [f"- {note}" for note in report["notes"]]
    if report.get("files", {}).get("png"):
        lines += ["", "![interference](interference.png)"]
    lines += ["", "Every phase's figures: `report.json`; LoadGen logs: `loadgen/`.", ""]
    path.write_text("\n".join(lines))
    return path


def print_summary(report: dict[str, Any]) -> None:
    """The table of medians on the terminal, and where the report went."""
    console = make_console()
    title = (f"interference: {report['protected']['model']} beside {report['neighbor']['model']} "
             f"(medians over {report['repeats']})")  # fmt: skip
    cells = map(_cells, report["summary"]["conditions"])
    console.print(rich_table(title, HEADERS, cells, ("condition",)))
    for note in report["notes"]:
        console.print(note)
    console.print(f"report: {report.get('files', {}).get('json')}")


def plot(report: dict[str, Any], path: Path) -> Path | None:
    """The protected p99 and the neighbor's rate by condition: medians (bars), repetitions."""
    plt = pyplot()
    phases = report["phases"]
    names = list(dict.fromkeys(p["condition"] for p in phases))
    if not names:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    # Alone and QoS on are a few ms beside QoS off's hundreds: on a linear axis they vanish.
    left.set_yscale("log")
    for ax, key, scale, unit in ((left, "p99_s", 1e3, "ms"), (right, "neighbor_rate", 1.0, "/s")):
        medians: dict[str, float] = {}
        for x, name in enumerate(names):
            values = [p[key] * scale for p in phases if p["condition"] == name and p[key]]
            if values:
                medians[name] = statistics.median(values)
                ax.bar(x, medians[name], color="#9bb7d4")
                ax.scatter([x] * len(values), values, color="black", s=12, zorder=3)
        base = medians.get("alone")
        for x, name in enumerate(names):
            if name in medians:
                # The median's value on its bar, and against alone: the figures a reader wants.
                text = f"{medians[name]:,.3g} {unit}"
                if base and name != "alone":
                    text += f"\n{medians[name] / base:.2g}x alone"
                ax.annotate(text, (x, medians[name]), ha="center", va="bottom", fontsize=9,
                            textcoords="offset points", xytext=(0, 4))  # fmt: skip
        ax.set_xticks(range(len(names)), names)
        if medians:
            # Room above the tallest bar for its label (a factor on the log axis).
            top = max(max(medians.values()), *(p[key] * scale for p in phases if p[key]))
            ax.set_ylim(top=top * (4 if ax is left else 1.25))
    left.set_ylabel("protected tenant's p99 (ms, log scale)")
    left.set_title("protected tenant's p99: lower is better")
    right.set_ylabel("neighbor's rows/s")
    right.set_title("neighbor's throughput: higher is better")
    rows: list[dict[str, Any]] = report["summary"]["conditions"]
    alone = next((r for r in rows if r["condition"] == "alone"), {})
    if alone.get("protected_p99_s"):
        bound = alone["protected_p99_s"] * 1e3 * report["targets"]["p99_ratio"]
        left.axhline(bound, linestyle="--", color="grey", label="target: 1.2 x alone")
    objective = report["protected"]["objective_s"]
    if objective:
        left.axhline(
            objective * 1e3, linestyle=":", color="red", label=f"objective {objective * 1e3:g} ms"
        )
    left.legend(loc="upper left")
    if alone.get("neighbor_rate") and alone.get("protected_share") is not None:
        rest = alone["neighbor_rate"] * (1 - alone["protected_share"])
        right.axhline(rest, linestyle=":", color="grey", label="alone x (1 - protected share)")
        right.axhline(rest * report["targets"]["neighbor_kept"], linestyle="--", color="grey",
                      label="target: 80% of that")  # fmt: skip
        right.legend(loc="lower left")
    fig.suptitle(f"{report['protected']['model']} beside {report['neighbor']['model']}")
    return save(fig, path)
