"""The accuracy guard's metrics, metric choice and verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.errors import OptimizeError
from dlscale.optimize.accuracy import Metric, choose_metric, compare

SCORES = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.3, 0.5], [0.0, 0.6, 0.4]], np.float32)
LABELS = np.array([1, 0, 2, 2])


def test_metric_choice_follows_labels_then_shape() -> None:
    classes = {"output": SCORES}
    assert choose_metric("auto", has_labels=True, outputs=classes) is Metric.TOP1
    assert choose_metric("auto", has_labels=False, outputs=classes) is Metric.AGREEMENT
    embed = {"a": np.zeros((4, 8, 3)), "b": np.zeros((4, 3))}
    assert choose_metric("auto", has_labels=False, outputs=embed) is Metric.COSINE
    assert choose_metric("maxabs", has_labels=True, outputs=classes) is Metric.MAXABS


def test_metric_that_cannot_apply_is_refused() -> None:
    with pytest.raises(OptimizeError, match="needs labels"):
        choose_metric("top1", has_labels=False, outputs={"output": SCORES})
    with pytest.raises(OptimizeError, match="2-D output"):
        choose_metric("agreement", has_labels=False, outputs={"x": np.zeros((4, 8, 3))})
    with pytest.raises(OptimizeError, match="expected auto or one of"):
        choose_metric("f1", has_labels=False, outputs={"output": SCORES})


def test_top1_compares_task_accuracy_against_the_labels() -> None:
    worse = SCORES.copy()
    worse[0] = [1.0, 0.0, 0.0]  # a right answer turned wrong: 3/4 -> 2/4
    check = compare(Metric.TOP1, {"output": SCORES}, {"output": worse}, 0.01, LABELS)
    assert check.reference_value == pytest.approx(0.75)
    assert check.value == pytest.approx(0.5)
    assert check.deviation == pytest.approx(0.25)
    assert not check.accepted
    assert check.excess == pytest.approx(0.24)
    assert "beyond the 1.00% tolerance by 24.00%" in check.describe()


def test_agreement_counts_changed_top1() -> None:
    changed = SCORES.copy()
    changed[3] = [0.0, 0.4, 0.6]
    check = compare(Metric.AGREEMENT, {"o": SCORES}, {"o": changed}, 0.3)
    assert check.value == pytest.approx(0.75)
    assert check.accepted


def test_cosine_and_maxabs_take_the_worst_output() -> None:
    rng = np.random.default_rng(0)
    ref = {"a": rng.standard_normal((16, 32)), "b": rng.standard_normal((16, 4))}
    got = {"a": ref["a"].copy(), "b": ref["b"] + 0.1}
    cos = compare(Metric.COSINE, ref, got, 0.0)
    assert 0 < cos.deviation < 0.05 and not cos.accepted
    mab = compare(Metric.MAXABS, ref, got, 0.5)
    assert mab.value == pytest.approx(0.1 / np.abs(ref["b"]).max())
    same = compare(Metric.COSINE, ref, {k: v.copy() for k, v in ref.items()}, 0.0)
    assert same.accepted and same.deviation == pytest.approx(0.0, abs=1e-12)
