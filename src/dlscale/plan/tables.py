"""Plain text tables for the plan verbs' answers.

Here, below both plan/commands.py and plan/mig_commands.py, so that the MIG verb shares the
table without importing the module that dispatches to it.
"""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> str:
    """A plain text table, columns padded to their widest cell; no header line when None."""
    cells = [list(headers)] if headers else []
    cells += [list(r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if headers:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
