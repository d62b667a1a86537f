"""Intervals that every reported number carries."""

from __future__ import annotations

import numpy as np
import pytest

from mascot.stats import (
    clustered_mean,
    crossed_clustered_mean,
    describe,
    histogram,
    mean_over_runs,
    paired_difference,
    proportion,
)


def test_wilson_interval_matches_the_closed_form():
    result = proportion(7, 10)
    z = 1.959963984540054
    centre = (0.7 + z * z / 20) / (1 + z * z / 10)
    half = z / (1 + z * z / 10) * np.sqrt(0.7 * 0.3 / 10 + z * z / 400)
    assert result["value"] == 0.7 and result["n"] == 10
    assert result["ci_low"] == pytest.approx(centre - half) and result["ci_high"] == pytest.approx(centre + half)


def test_an_empty_proportion_has_no_value_rather_than_zero():
    assert proportion(0, 0) == {"value": None, "n": 0, "ci_low": None, "ci_high": None, "confidence": 0.95}


def test_paired_bootstrap_interval_covers_a_clear_improvement():
    rng = np.random.default_rng(1)
    before = rng.normal(0, 1, 200)
    after = before + 0.5 + rng.normal(0, 0.2, 200)
    result = paired_difference(before, after, resamples=2000)
    assert result["n"] == 200
    assert 0.4 < result["ci_low"] < result["mean"] < result["ci_high"] < 0.6


def test_paired_bootstrap_is_seeded():
    before, after = [1.0, 2.0, 3.0, 4.0], [1.5, 2.0, 3.9, 4.1]
    assert paired_difference(before, after, seed=3) == paired_difference(before, after, seed=3)


def test_a_constant_difference_gives_a_point_interval():
    result = paired_difference([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    assert result["mean"] == result["ci_low"] == result["ci_high"] == pytest.approx(0.5)


def test_unpaired_samples_are_refused():
    with pytest.raises(ValueError, match="3 before, 2 after"):
        paired_difference([1, 2, 3], [1, 2])


def test_describe_reports_n_and_spread():
    result = describe([1.0, 2.0, 3.0, 4.0])
    assert result["n"] == 4 and result["mean"] == 2.5 and result["sd"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert describe([])["n"] == 0 and describe([])["mean"] is None


def test_a_clustered_interval_is_wider_than_one_that_treats_clustered_items_as_independent():
    # Four contexts of 25 pairs each, each context all right or all wrong: really 4 observations, not 100.
    values = [1.0] * 50 + [0.0] * 50
    clusters = [f"c{i // 25}" for i in range(100)]
    clustered = clustered_mean(values, clusters, resamples=4000)
    wilson = proportion(50, 100)
    assert clustered["value"] == 0.5 and clustered["n"] == 100 and clustered["clusters"] == 4
    assert clustered["ci_high"] - clustered["ci_low"] > 2 * (wilson["ci_high"] - wilson["ci_low"])
    # With every item its own cluster, it agrees with the usual interval.
    independent = clustered_mean(values, [str(i) for i in range(100)], resamples=4000)
    assert abs(independent["ci_low"] - wilson["ci_low"]) < 0.05


def test_a_clustered_mean_of_nothing_is_not_available_and_mismatched_labels_fail():
    assert clustered_mean([], [])["value"] is None
    # One cluster (a held-out meeting's windows): a mean, but no spread between clusters to give an interval.
    one = clustered_mean([1.0, 0.0, 1.0], ["m", "m", "m"])
    assert one["value"] == pytest.approx(2 / 3) and one["clusters"] == 1 and one["ci_low"] is one["ci_high"] is None
    with pytest.raises(ValueError, match="2 values but 1 cluster labels"):
        clustered_mean([1.0, 0.0], ["a"])


def test_the_crossed_bootstrap_resamples_raters_as_well_as_contexts():
    """Every difference lies between the two raters (one always 1, the other always 0, on every context): an
    interval over contexts alone cannot see it, and the crossed one must span most of [0, 1]."""
    contexts = [f"c{i}" for i in range(20)] * 2
    raters, values = ["ann"] * 20 + ["bo"] * 20, [1.0] * 20 + [0.0] * 20
    by_context = clustered_mean(values, contexts, resamples=500)
    assert by_context["ci_low"] == by_context["ci_high"] == 0.5, "every context's mean is 0.5"
    crossed = crossed_clustered_mean(values, contexts, raters, resamples=500)
    assert (crossed["value"], crossed["rows"], crossed["columns"], crossed["n"]) == (0.5, 20, 2, 40)
    # Drawing the two raters gives {ann, ann}, {ann, bo} or {bo, bo}: means 1, 0.5 and 0, a quarter, a half
    # and a quarter of the time, so the 95% interval is [0, 1].
    assert (crossed["ci_low"], crossed["ci_high"]) == (0.0, 1.0) and crossed["empty_resamples"] == 0
    # And where all the variance is between contexts, the crossed interval still sees it.
    varied = crossed_clustered_mean([float(i % 2) for i in range(40)], contexts, raters, resamples=500)
    assert varied["ci_low"] < 0.4 and varied["ci_high"] > 0.6


def test_the_crossed_bootstrap_skips_a_resample_that_keeps_no_item_and_checks_its_labels():
    # A sparse design: each rater rated one context only, so drawing ann's context with bo's rater keeps nothing.
    result = crossed_clustered_mean([1.0, 0.0], ["c1", "c2"], ["ann", "bo"], resamples=400)
    assert result["empty_resamples"] > 0 and 0 <= result["ci_low"] <= result["ci_high"] <= 1
    with pytest.raises(ValueError, match="2 values but 1 row and 2 column labels"):
        crossed_clustered_mean([1.0, 0.0], ["c1"], ["ann", "bo"])
    assert crossed_clustered_mean([], [], [])["value"] is None


def test_a_histogram_of_values_equal_but_for_float_noise():
    """The reward model's margin histogram: 0.4 - 0.1 and 0.7 - 0.4 are 0.3 but for their last bits."""
    assert sum(histogram([0.4 - 0.1, 0.7 - 0.4])["counts"]) == 2


def test_the_mean_over_runs_has_students_t_interval_and_none_from_one_run():
    result = mean_over_runs([0.006, 0.031, -0.013])
    # mean 0.008, sd 0.02207; t(0.975, 2) = 4.3027: half-width 4.3027 * 0.02207 / sqrt(3) = 0.0548
    assert result["mean"] == pytest.approx(0.008) and result["sd"] == pytest.approx(0.02207, abs=1e-5)
    assert (result["ci_low"], result["ci_high"]) == pytest.approx((0.008 - 0.0548, 0.008 + 0.0548), abs=1e-4)
    one = mean_over_runs([0.02])
    assert one["mean"] == 0.02 and one["ci_low"] is None and one["ci_high"] is None  # no spread, no interval
