"""How every report draws: PNG figures, figures as text ("-" when missing), and tables for the
terminal and for Markdown."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (imported when a report draws, not before)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Lay the figure out, write it to `path` as PNG and free it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def percentile_lines(
    ax: Any, name: str, x: Sequence[float], latency_s: Sequence[Any], labels: Sequence[str]
) -> None:
    """One series against `x`: its p50 (solid) and p99 (dashed) latency in ms, from each
    point's percentiles in seconds, and each point labelled above its p99."""
    for key, style in (("p50", "-"), ("p99", "--")):
        y = [lat[key] * 1e3 for lat in latency_s]
        ax.plot(x, y, marker="o", linestyle=style, label=f"{name} {key}")
    for text, xi, lat in zip(labels, x, latency_s, strict=True):
        ax.annotate(text, (xi, lat["p99"] * 1e3), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=8)  # fmt: skip


def fmt(value: Any, spec: str = "") -> str:
    """A figure formatted by `spec` (format's mini-language); "-" for a missing figure."""
    return "-" if value is None else format(value, spec)


def fmt_ms(seconds: float | None, digits: int = 3) -> str:
    """Seconds shown as milliseconds; "-" for a missing figure."""
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def fmt_rate(value: float | None, digits: int = 1) -> str:
    """A rate (or any figure) with thousands separators; "-" for a missing figure."""
    return fmt(value, f",.{digits}f")


def rich_table(
    title: str,
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    left: Collection[str] = (),
) -> Table:
    """A terminal table: the `left` columns aligned left, the figures right."""
    table = Table(title=title)
    for header in headers:
        table.add_column(header, justify="left" if header in left else "right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], left: Collection[str] = ()
) -> list[str]:
    """The same table in Markdown: the `left` columns aligned left, the figures right."""
    rule = ["---" if header in left else "---:" for header in headers]
    head, *body = ["| " + " | ".join(map(str, cells)) + " |" for cells in (headers, *rows)]
    return [head, "|" + "|".join(rule) + "|", *body]
