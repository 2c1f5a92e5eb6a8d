"""The code blocks of the user's docs (README.md, BENCHMARKS.md, docs/*.md), for the tests that
run or parse what the docs show."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]


def code_blocks(doc: Path) -> list[tuple[str, str]]:
    """Each fenced block of `doc` as (its language, '' when none; its text)."""
    blocks: list[tuple[str, str]] = []
    language, lines, inside = "", [], False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            if inside:
                blocks.append((language, "\n".join(lines) + "\n"))
            inside, language, lines = not inside, line[3:].strip(), []
        elif inside:
            lines.append(line)
    return blocks
