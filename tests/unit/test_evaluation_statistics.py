"""The evaluation's statistics, against values worked out by hand on small arrays."""

from __future__ import annotations

import numpy as np
import pytest

from mascot.evaluation.statistics import (
    holm,
    judge_agreement,
    paired_comparison,
    per_context_means,
    summarise,
    win_rate,
)


def test_a_summary_counts_contexts_and_seeds_and_its_interval_covers_the_mean():
    rng = np.random.default_rng(0)
    contexts = [f"c{i}" for i in range(20) for _ in range(3)]
    seeds = [seed for _ in range(20) for seed in range(3)]
    values = [5.0 + rng.normal(0, 1) for _ in contexts]
    result = summarise(values, contexts, seeds)
    assert (result["n"], result["contexts"], result["seeds"], result["undefined"]) == (60, 20, 3, 0)
    assert result["mean"] == pytest.approx(np.mean(values))
    assert result["sd"] == pytest.approx(np.std(values, ddof=1))
    assert result["ci_low"] < 5.0 < result["ci_high"]
    assert result["ci_high"] - result["ci_low"] < 1.5


def test_undefined_values_are_counted_apart_not_scored():
    result = summarise([1.0, None, 3.0], ["a", "a", "b"], [0, 0, 0])
    assert (result["mean"], result["n"], result["undefined"]) == (2.0, 2, 1)
    assert per_context_means([1.0, None, 3.0, 5.0], ["a", "a", "b", "b"]) == {"a": 1.0, "b": 4.0}


def test_the_paired_test_is_wilcoxon_exact_by_hand():
    # Five contexts, every one better by 1..5: all signed ranks positive, so the exact two-sided
    # p-value is 2 * P(W+ = 15) = 2 / 2**5.
    baseline = {f"c{i}": 0.0 for i in range(5)}
    system = {f"c{i}": float(i + 1) for i in range(5)}
    result = paired_comparison(system, baseline)
    assert result["p"] == pytest.approx(2 / 32)
    assert result["mean"] == pytest.approx(3.0) and result["contexts"] == 5
    assert result["sd"] == pytest.approx(np.std([1, 2, 3, 4, 5], ddof=1))
    assert result["ci_low"] <= 3.0 <= result["ci_high"]


def test_a_comparison_uses_only_the_contexts_both_systems_have():
    result = paired_comparison({"a": 1.0, "b": 2.0, "c": 9.0}, {"a": 1.0, "b": 2.0})
    assert result["contexts"] == 2 and result["mean"] == 0.0 and result["p"] == 1.0


def test_holm_adjusts_in_step_down_order():
    # sorted: 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 = 0.04 -> raised to 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, None, 0.6]) == [pytest.approx(1.0), None, pytest.approx(1.0)]


def test_krippendorff_alpha_by_hand():
    # Two judges, four items, one disagreement of 1 point (4 against 5). Values 1,1,2,2,3,3,4,5:
    # D_o = (1/8) * 2 * 1**2 = 0.25; D_e = sum of squared differences over ordered value pairs /
    # (8 * 7) = 2 * 8 * 13.875 / 56 = 3.9643; alpha = 1 - D_o / D_e.
    scores = {"a": {"i1": 1, "i2": 2, "i3": 3, "i4": 4}, "b": {"i1": 1, "i2": 2, "i3": 3, "i4": 5}}
    assert judge_agreement(scores)["alpha"] == pytest.approx(1 - 0.25 / (222 / 56))
    assert judge_agreement({"a": {"i1": 1, "i2": 2}})["alpha"] is None


def test_win_rate_counts_ties_as_half():
    result = win_rate([1, 1, 0.5, 0], ["a", "a", "b", "b"])
    assert (result["wins"], result["ties"], result["losses"], result["contexts"]) == (2, 1, 1, 2)
    assert result["win_rate"] == pytest.approx(0.625)
