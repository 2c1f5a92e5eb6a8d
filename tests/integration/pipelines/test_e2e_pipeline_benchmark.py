"""benchmarks/e2e_pipeline.py run as its user runs it, on dlscale and Ray Serve (PyTriton needs
its own venv: `make bench` installs it), one short repetition."""

from __future__ import annotations

import json
from pathlib import Path

from tests.toolkit.benchmarks import ROOT, run_benchmark
from tests.toolkit.slow import slow_only


@slow_only("a Ray cluster and a dlscale server started, about a minute on 2 cores")
def test_the_e2e_benchmark_classifies_alike_everywhere_and_states_its_targets() -> None:
    argv = ["--repeats", "1", "--duration", "1", "--images", "8"]
    done = run_benchmark("e2e_pipeline", *argv, "--servers", "dlscale", "ray-serve", timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((ROOT / Path(done.stdout.strip().splitlines()[-1])).read_text())
    runs = [r for r in data["rows"] if r["bench"] == "e2e"]
    assert {(r["server"], r["concurrency"]) for r in runs} == {
        (s, c) for s in ("dlscale", "ray-serve") for c in (1, 32)
    }
    # Every server answered every request, with the same top-1 label for the same image.
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in runs)
    assert len({r["top1"] for r in runs}) == 1
    # The steps alone, and dlscale's per-step breakdown at concurrency 1.
    alone = next(r for r in data["rows"] if r["bench"] == "alone")
    assert all(alone[f"{k}_p50_ms"] > 0 for k in ("decode", "model", "topk"))
    breakdown = next(r["breakdown"] for r in runs if "breakdown" in r)
    assert [s["model"] for s in breakdown["steps"]][1] == "smallcnn"
    # The targets are stated with their figures, met or missed.
    verdicts = data["verdicts"]
    assert any(v.startswith("c=32: dlscale") for v in verdicts)
    assert any(v.startswith("overhead at p50") for v in verdicts)
