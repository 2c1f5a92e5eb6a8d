"""A benchmark script run as its user runs it, `python -m benchmarks.NAME`: tests never import
benchmarks/, they run its scripts in a child process and read what they print or write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    name: str, *argv: str, timeout: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.NAME ARGV` from the checkout's root, with its output; the caller
    checks the exit code (and shows the output when it is not 0)."""
    paths = [str(ROOT / "src"), str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
