"""The winner is decided on repeated runs: a lead inside their spread keeps the FP32 source."""

from __future__ import annotations

import pytest

from dlscale.errors import OptimizeError
from dlscale.optimize.decide import clearly_faster, decide, fastest
from dlscale.optimize.measure import Speed
from dlscale.optimize.results import Trial
from dlscale.optimize.variants import Variant


def _speed(*runs: float) -> Speed:
    ordered = sorted(runs)
    return Speed(ordered[len(ordered) // 2], None, True, None, "", tuple(runs))


def _trial(name: str, *runs: float, status: str = "accepted") -> Trial:
    trial = Trial(Variant(name, "fp32", "copy"), 1, status=status)
    trial.speed = _speed(*runs)
    return trial


def test_a_clear_win_replaces_the_source() -> None:
    fp32, int8 = _trial("fp32", 100, 104, 98), _trial("int8", 150, 149, 155)
    decision = decide([fp32, int8])
    assert decision.winner is int8 and not decision.keeps_source
    assert "150/149/155" in decision.reason and "100/104/98" in decision.reason
    # 149 over 104 is a 43% margin, above both spreads (4% and 6%): a firm lead.
    assert "confidence: high, slowest run 43% above FP32's fastest" in decision.reason


def test_a_lead_inside_the_spread_keeps_the_source_and_writes_nothing() -> None:
    # Measured: FP32 "won" and a copy of the source was written as a new version; and a lead
    # of a few percent on a shared machine is noise.
    fp32, bf16 = _trial("fp32", 100, 110, 95), _trial("bf16", 108, 112, 104)
    decision = decide([fp32, bf16])
    assert decision.winner is fp32 and decision.keeps_source
    assert "within the runs' spread" in decision.reason
    assert "confidence: none, the runs overlap (run-to-run spread 7% and FP32's 15%)" in (
        decision.reason
    )


def test_a_lead_smaller_than_the_spread_is_a_moderate_confidence() -> None:
    # Every run faster, but by less than the runs vary (15-37% was seen on this machine).
    fp32, int8 = _trial("fp32", 100, 80, 90), _trial("int8", 105, 140, 120)
    decision = decide([fp32, int8])
    assert decision.winner is int8
    assert "confidence: moderate, slowest run 5% above FP32's fastest" in decision.reason


def test_fp32_fastest_writes_nothing() -> None:
    fp32 = _trial("fp32", 120, 121, 119)
    decision = decide([fp32, _trial("int8", 90, 91, 89)])
    assert decision.winner is fp32 and decision.keeps_source


def test_rejected_variants_do_not_win_and_without_fp32_the_fastest_does() -> None:
    fp32, lossy = _trial("fp32", 100), _trial("fp8", 900, status="rejected")
    assert decide([fp32, lossy]).winner is fp32
    alone = _trial("int8", 50, 52, 51)
    assert decide([alone]).winner is alone and not decide([alone]).keeps_source
    with pytest.raises(OptimizeError, match="no variant was accepted"):
        fastest([lossy])


def test_the_spread_and_the_rule() -> None:
    speed = _speed(90, 100, 110)
    assert speed.offline_sps == 100 and speed.spread == pytest.approx(0.2)
    assert speed.to_dict()["offline_runs"] == [90, 100, 110]
    assert _speed(100).spread == 0.0
    assert clearly_faster(_speed(111, 112), _speed(100, 110))
    assert not clearly_faster(_speed(110, 200), _speed(100, 110))
