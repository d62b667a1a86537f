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


def test_the_paired_test_is_the_exact_sign_flip_test_of_the_mean_by_hand():
    # Five contexts, every one better by 1..5: only all-plus and all-minus reach |sum| 15, so the exact
    # two-sided p-value is 2 / 2**5.
    baseline = {f"c{i}": 0.0 for i in range(5)}
    system = {f"c{i}": float(i + 1) for i in range(5)}
    result = paired_comparison(system, baseline)
    assert result["p"] == pytest.approx(2 / 32) and result["permutations"] == 32 and result["exact"]
    # Where a rank test and a test of the mean part: differences 1, 1, 1, 10 (p = 2/16 for the mean).
    skewed = paired_comparison({"a": 1.0, "b": 1.0, "c": 1.0, "d": 10.0}, dict.fromkeys("abcd", 0.0))
    assert skewed["p"] == 0.125 and "sign-flip" in skewed["test"]
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


def test_the_sign_flip_test_counts_sign_assignments_by_hand():
    from mascot.evaluation.statistics import sign_flip_test

    # 1, 1, 1, 10: of the 16 assignments, only all-plus and all-minus reach |sum| 13, so p = 2/16.
    result = sign_flip_test([1, 1, 1, 10])
    assert (result["p"], result["permutations"], result["exact"]) == (0.125, 16, True)
    assert "exact, all 16 sign assignments" in result["test"]
    # 1, 2, 3: |sum| 6 by all-plus and all-minus of 8: p = 0.25.
    assert sign_flip_test([1, 2, 3])["p"] == 0.25
    # It tests the mean, not the signs' majority: nine losses of 1 and one win of 20 have mean +1.1, and every
    # assignment's |sum| is at least 20 - 9 = 11, so p = 1 (a rank test would see nine of ten units below 0).
    mixed = sign_flip_test([-1] * 9 + [20])
    assert mixed["exact"] and mixed["p"] == 1.0
    # Beyond 16 units: a seeded sample, its size stated, p never 0.
    large = sign_flip_test([1.0] * 20, resamples=999)
    assert (large["exact"], large["permutations"]) == (False, 999)
    assert large["p"] == pytest.approx(3 / 1000, abs=2 / 1000) and large["p"] >= 1 / 1000
    assert "Monte Carlo, 999 random sign assignments" in large["test"]
    assert sign_flip_test([])["p"] is None


def test_pairs_are_context_and_seed_and_a_conversation_without_its_partner_is_left_out_and_counted():
    import polars as pl

    from mascot.evaluation.results import build_summary
    from mascot.evaluation.scoring import SCORE_SCHEMA

    rows = []
    for context, (mascot, baseline) in {"c1": ((60, 100), (50, None)), "c2": ((70, 70), (60, 60)),
                                        "c3": ((80, 80), (70, 70))}.items():
        for seed in (0, 1):
            for system, values in (("mascot", mascot), ("zero_shot", baseline)):
                if values[seed] is not None:
                    rows.append({"system": system, "context_id": context, "seed": seed, "level": "persona",
                                 "metric": "overall", "judge": "j", "value": float(values[seed])})
    contexts = pl.DataFrame({"context_id": ["c1", "c2", "c3"], "eval_set": ["held_out"] * 3,
                             "valence": [None] * 3, "meeting_type": [None] * 3},
                            schema_overrides={"valence": pl.String, "meeting_type": pl.String})
    summary = build_summary("r", ["mascot", "zero_shot"], [0, 1], {}, contexts, pl.DataFrame(rows, schema=SCORE_SCHEMA),
                            pl.DataFrame({"role": ["companion"], "reasoning_marked": [None]},
                                         schema_overrides={"reasoning_marked": pl.Boolean}), resamples=200)
    [comparison] = summary["results"]["held_out"]["comparisons"]
    # MASCOT's c1 seed-1 conversation (100) has no partner: left out, so c1's difference is 60 - 50 = 10, not
    # the 80 - 50 = 30 of unpaired means; every context differs by 10.
    assert comparison["mean"] == pytest.approx(10.0) and (comparison["pairs"], comparison["unpaired"]) == (5, 1)
    assert comparison["p"] == 0.25, "3 clusters all +10: exact p = 2/8"
    # One family: the sets "all" and "held_out", one comparison each, Holm over both (p 0.25 each -> 0.5).
    assert summary["holm_family"] == 2 and comparison["p_holm"] == pytest.approx(0.5)
    assert comparison["holm_family"] == "every comparison of the report (2)"


def test_judge_agreement_is_within_each_system_with_an_interval():
    """Two judges who disagree on every conversation within each system, while the systems differ by 60 points:
    pooled, the systems' difference would read as agreement; within each system there is none."""
    import polars as pl

    from mascot.evaluation.results import judge_agreements
    from mascot.evaluation.scoring import SCORE_SCHEMA

    noise = [1, -1, 2, -2, 1, -1, 2, -2]
    rows = [{"system": system, "context_id": f"c{i}", "seed": 0, "level": "collective", "metric": "overall",
             "judge": judge, "value": float(base + sign * e)}
            for system, base in (("mascot", 20), ("zero_shot", 80)) for i, e in enumerate(noise)
            for judge, sign in (("j1", 1), ("j2", -1))]
    scores = pl.DataFrame(rows, schema=SCORE_SCHEMA)
    pooled = judge_agreement({j: {f"{r['system']}|{r['context_id']}": r["value"] for r in rows if r["judge"] == j}
                              for j in ("j1", "j2")})
    assert pooled["alpha"] > 0.95, "pooled across systems, the judges look in near-perfect agreement"
    agreement = judge_agreements(scores, confidence=0.9)["collective"]
    assert agreement["judges"] == 2 and agreement["within"] == "system"
    for system in ("mascot", "zero_shot"):
        result = agreement["systems"][system]
        assert result["alpha"] < 0 and result["items"] == 8, "within a system they never agree"
        assert result["ci_low"] <= result["alpha"] <= result["ci_high"] and result["resamples"] > 0
    assert judge_agreements(scores.filter(pl.col("judge") == "j1"))["collective"]["systems"]["mascot"]["alpha"] is None
