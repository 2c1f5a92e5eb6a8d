"""The many-model bench's pure parts: the Zipf mix, loads seen in samples, and the comparison
of the same requests under a budget and all resident."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

from dlscale.bench.multimodel import Mix, Phase, Sample, Sent
from dlscale.bench.multimodel_report import summary, write


def test_the_mix_follows_zipf_and_the_rate() -> None:
    mix = Mix(tuple(f"m{i}" for i in range(100)), zipf=1.1, rate=200.0, duration_s=50.0, seed=3)
    schedule = mix.schedule()
    assert schedule == mix.schedule()  # the same seed, the same requests: phases compare
    assert 9000 < len(schedule) < 11000
    assert all(a < b for (a, _), (b, _) in itertools.pairwise(schedule))
    counts = Counter(model for _, model in schedule)
    # Zipf(1.1): the first model is asked 2^1.1 = 2.14 times as often as the second.
    assert counts["m0"] / counts["m1"] == pytest.approx(2**1.1, rel=0.15)
    assert counts["m0"] > counts["m9"] > counts["m99"]


def _sent(latencies: list[float], cold: list[bool], models: list[str]) -> list[Sent]:
    return [
        Sent(float(i), m, s, 200, c)
        for i, (s, c, m) in enumerate(zip(latencies, cold, models, strict=True))
    ]


def test_the_same_requests_are_compared_and_cold_first_answers_found() -> None:
    models = ["a", "b", "a", "b", "c", "c"]
    budget = Phase(
        "budget",
        _sent([0.5, 0.6, 0.02, 0.7, 0.9, 0.03], [True, True, False, True, True, False], models),
        [
            Sample(0.0, frozenset(), 0),
            Sample(0.1, frozenset({"a"}), 10),
            Sample(0.2, frozenset({"a", "b"}), 20),
        ],
        budget_bytes=15,
        load_s=[0.4],
    )
    every = Phase("all", _sent([0.01] * 6, [False] * 6, models), [Sample(0.0, frozenset(), 0)])
    figures = summary(budget, every)
    assert figures["hit_rate"] == pytest.approx(2 / 6)
    assert figures["loads"] == 2  # a, then b, turned READY between samples
    assert figures["samples_over_budget"] == 1 and figures["max_resident_bytes"] == 20
    assert figures["resident_p99_vs_all_resident"] == pytest.approx(
        (0.02 + 0.99 * 0.01) / 0.01, rel=1e-6
    )
    # First answers of a cold run: a (0.5), b (0.6), c (0.9); b's second cold one is not first.
    firsts = figures["cold_first_answer_vs_load_plus_one"]
    assert firsts["count"] == 3
    assert firsts["max"] == pytest.approx(0.9 / 0.41)
    assert firsts["within_2x"] == pytest.approx(2 / 3)
    assert figures["models"]["a"] == {
        "requests": 2, "cold": 1, "resident_p99_s": 0.02, "cold_p50_s": 0.5,
    }  # fmt: skip


def test_each_phase_s_requests_are_written_one_line_each(tmp_path: Path) -> None:
    sent = _sent([0.5, 0.02], [True, False], ["a", "a"])
    phase = Phase("budget", sent, [Sample(0.0, frozenset(), 0), Sample(1.0, frozenset({"a"}), 1)])
    write(tmp_path, [phase], [summary(phase)])
    lines = (tmp_path / "requests-budget.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert rows == [dataclasses.asdict(s) for s in sent]
    assert rows[0] == {"at": 0.0, "model": "a", "latency_s": 0.5, "status": 200, "cold": True}
