"""The evaluation's statistics, against values worked out by hand on small arrays."""

from __future__ import annotations

import numpy as np
import pytest

from mascot.evaluation.statistics import (
    holm,
    judge_agreement,
    paired_comparison,
    paired_comparison_over_runs,
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


def test_one_cluster_gives_no_interval_where_a_bootstrap_would_give_one_of_no_width():
    """Nine windows of one held-out meeting: every resample draws that meeting, so the bootstrap's 'interval' would
    be the mean itself. Each figure keeps its mean and says it has no interval; with two clusters it has one."""
    from mascot.evaluation.report import bracket

    windows = [f"w{i}" for i in range(9)]
    values = [float(i) for i in range(9)]
    one = summarise(values, windows, [0] * 9, clusters=["meeting-a"] * 9)
    assert one["mean"] == pytest.approx(4.0) and one["clusters"] == 1 and one["ci_low"] is one["ci_high"] is None
    assert bracket(one, ".1f") == "[no interval: 1 cluster]"
    two = summarise(values, windows, [0] * 9, clusters=["meeting-a"] * 4 + ["meeting-b"] * 5)
    assert two["ci_low"] < two["ci_high"] and bracket(two, ".1f").startswith("[1.")
    compared = paired_comparison({"meeting-a": 3.0}, {"meeting-a": 1.0})
    assert compared["mean"] == 2.0 and compared["ci_low"] is None
    runs = paired_comparison_over_runs({("meeting-a", 0): 3.0, ("meeting-a", 1): 5.0},
                                       {("meeting-a", 0): 1.0, ("meeting-a", 1): 1.0})
    assert runs["mean"] == 3.0 and runs["ci_low"] is None
    rate = win_rate([1, 0, 1], ["meeting-a"] * 3)
    assert rate["win_rate"] == pytest.approx(2 / 3) and rate["ci_low"] is None


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


def _panel_rows(quality: dict[str, float], harsh_fails: set[tuple[str, str]], short_turns: set[tuple[str, str]] = ()):
    """Two systems of equal quality per context, judged by a lenient judge j1 (the quality) and a harsh one j2 (30
    points lower, over twice the spread), each on 2 turns; j2 fails on the (system, context)s of `harsh_fails`, and
    scores only one of the two turns of those of `short_turns`."""
    rows = []
    for system in ("mascot", "zero_shot"):
        for context, q in quality.items():
            for judge, value in (("j1", q), ("j2", 2 * q - 90)):
                if judge == "j2" and (system, context) in harsh_fails:
                    continue
                n = 1 if judge == "j2" and (system, context) in short_turns else 2
                rows.append({"system": system, "context_id": context, "seed": 0, "level": "persona",
                             "metric": "overall", "judge": judge, "value": float(value), "n": n, "items": 2})
    return rows


QUALITY = {"c1": 55.0, "c2": 40.0, "c3": 50.0, "c4": 60.0, "c5": 70.0, "c6": 55.0}  # c1 at the mean


def test_a_harsh_judge_moves_every_conversation_alike_so_a_panel_missing_it_is_not_lifted():
    import polars as pl

    from mascot.evaluation.results import panel_scores
    from mascot.evaluation.scoring import SCORE_SCHEMA

    scores = pl.DataFrame(_panel_rows(QUALITY, {("mascot", "c1")}), schema=SCORE_SCHEMA)
    panel = {(r["system"], r["context_id"]): r for r in panel_scores(scores).iter_rows(named=True)}
    # MASCOT's c1 has only the lenient judge; standardised within each judge, it is where zero_shot's c1 is (both
    # judges put c1 at their own mean, z = 0), where a plain mean over the judges left would lift it by
    # (55 - (2 * 55 - 90)) / 2 = 17.5 points.
    assert panel[("mascot", "c1")]["value"] == pytest.approx(panel[("zero_shot", "c1")]["value"])
    assert not panel[("mascot", "c1")]["complete"] and panel[("zero_shot", "c1")]["complete"]
    assert panel[("mascot", "c1")]["judges"] == 1
    # By hand: z = 0 puts the panel at the pooled mean of every score; c4 (60) at the pooled mean plus the pooled sd
    # times the mean of its two judges' z.
    rows = [r for r in _panel_rows(QUALITY, {("mascot", "c1")}) if (r["system"], r["context_id"]) != ("mascot", "c1")]
    values = [r["value"] for r in rows]  # each judge standardised on the conversations the whole panel scored
    assert panel[("mascot", "c1")]["value"] == pytest.approx(np.mean(values))
    z = [(next(r["value"] for r in rows if (r["judge"], r["system"], r["context_id"]) == (judge, "mascot", "c4"))
          - np.mean(own)) / np.std(own, ddof=1)
         for judge in ("j1", "j2") for own in [[r["value"] for r in rows if r["judge"] == judge]]]
    assert panel[("mascot", "c4")]["value"] == pytest.approx(np.mean(values) + np.std(values, ddof=1) * np.mean(z))


def test_an_incomplete_panel_is_left_out_and_counted_so_a_failed_judge_cannot_tilt_a_comparison():
    import polars as pl

    from mascot.evaluation.report import report_markdown
    from mascot.evaluation.results import build_summary
    from mascot.evaluation.scoring import SCORE_SCHEMA

    # The harsh judge fails on MASCOT's c1 and c2, and scores one turn of two of zero_shot's c3.
    rows = _panel_rows(QUALITY, {("mascot", "c1"), ("mascot", "c2")}, {("zero_shot", "c3")})
    contexts = pl.DataFrame({"context_id": list(QUALITY), "eval_set": ["held_out"] * 6, "valence": [None] * 6,
                             "meeting_type": [None] * 6},
                            schema_overrides={"valence": pl.String, "meeting_type": pl.String})
    summary = build_summary("r", ["mascot", "zero_shot"], [0], {}, contexts, pl.DataFrame(rows, schema=SCORE_SCHEMA),
                            pl.DataFrame({"role": ["companion"], "reasoning_marked": [None]},
                                         schema_overrides={"reasoning_marked": pl.Boolean}), resamples=200)
    [comparison] = summary["results"]["held_out"]["comparisons"]
    # Equal quality everywhere: the comparison is exactly 0 over the 3 complete pairs (c4, c5, c6); the three
    # conversations whose partner's panel was incomplete are unpaired.
    assert comparison["mean"] == pytest.approx(0.0, abs=1e-9)
    assert (comparison["pairs"], comparison["unpaired"]) == (3, 3)
    by_system = {e["system"]: e for e in summary["results"]["held_out"]["summaries"]}
    assert by_system["mascot"]["n"] == 4 and by_system["zero_shot"]["n"] == 5
    assert summary["incomplete_panels"] == {"persona": {"mascot": {"conversations": 6, "incomplete": 2},
                                                        "zero_shot": {"conversations": 6, "incomplete": 1}}}
    report = report_markdown(summary | {"preferences": [], "judges": {
        "persona": ["j1", "j2"], "collective": [], "pairwise": "heuristic", "shared_with_training": [],
        "heuristic_only": False}})
    assert "**Incomplete panels: 3 conversation score(s)**" in report
    assert "persona: MASCOT 2 of 6, Zero-Shot 1 of 6" in report


def test_a_judge_that_failed_on_one_turn_is_seen_as_an_incomplete_panel():
    """scores.parquet says how many of a conversation's items (its turns) each judge scored, and how many there were."""
    import polars as pl
    from test_cli import REPO

    from mascot.evaluation.results import panel_scores
    from mascot.evaluation.scoring import SCORE_SCHEMA, _judge_rows
    from mascot.rubrics import load_rubric

    rubric = load_rubric(REPO / "configs" / "rubrics" / "emotional_support.yaml")
    key = "mascot|c1|s0"
    judgments = pl.DataFrame([{"query_id": f"{key}|t{turn}", "judge": judge, "ok": ok, "overall": 4.0,
                               **{c: 4.0 for c in rubric.criterion_ids}}
                              for judge, oks in (("j1", (True, True)), ("j2", (True, False)))
                              for turn, ok in zip((0, 2), oks, strict=True)])
    rows = _judge_rows(judgments, rubric, "persona", {key: ("mascot", "c1", 0, 0, ["hello", "there"])})
    assert {(r["judge"], r["n"], r["items"]) for r in rows} == {("j1", 2, 2), ("j2", 1, 2)}
    assert not panel_scores(pl.DataFrame(rows, schema=SCORE_SCHEMA))["complete"].any()


def test_persona_level_agreement_is_on_the_turns_each_judge_rated_with_an_interval():
    """Two judges who agree on every conversation's mean over its turns but swap their scores turn by turn: on the
    conversations they look in perfect agreement; on the turns they rated, they are not."""
    import polars as pl

    from mascot.evaluation.results import judge_agreements
    from mascot.evaluation.scoring import SCORE_SCHEMA

    quality = [2.0, 3.0, 4.0, 2.5, 3.5, 3.0, 4.5, 2.0]
    judgments, scores = [], []
    for system in ("mascot", "zero_shot"):
        for i, q in enumerate(quality):
            key = f"{system}|c{i}|s0"
            for judge, swing in (("j1", 0.5), ("j2", -0.5)):
                judgments += [{"query_id": f"{key}|t{t}", "judge": judge, "ok": True, "overall": q + sign * swing,
                               "level": "persona"} for t, sign in ((0, 1), (1, -1))]
                scores.append({"system": system, "context_id": f"c{i}", "seed": 0, "level": "persona",
                               "metric": "overall", "judge": judge, "value": 25.0 * (q - 1)})
    judgments.append({"query_id": "mascot|c0|s0|t2", "judge": "j2", "ok": False, "overall": None, "level": "persona"})
    frame = pl.DataFrame(judgments)
    by_conversation = judge_agreements(pl.DataFrame(scores, schema=SCORE_SCHEMA))["persona"]
    by_turn = judge_agreements(pl.DataFrame(scores, schema=SCORE_SCHEMA), judgments=frame, confidence=0.9)["persona"]
    assert by_conversation["unit"] == "conversation" and by_turn["unit"] == "turn"
    for system in ("mascot", "zero_shot"):
        assert by_conversation["systems"][system]["alpha"] == pytest.approx(1.0)
        result = by_turn["systems"][system]
        assert result["items"] == 16, "every turn each judge rated ok, the failed judgment left out"
        assert result["alpha"] < 0.9 and result["ci_low"] <= result["alpha"] <= result["ci_high"]
        assert result["resamples"] > 0 and result["ci_low"] < result["ci_high"] < 1.0  # resampled, so it varies


def test_minimum_detectable_effect_by_hand():
    from mascot.evaluation.statistics import minimum_detectable_effect

    # sd 10 over 9 clusters at two-sided 0.05 and 80% power: (t_.975,8 = 2.3060 + t_.8,8 = 0.8889) * 10 / 3, from a
    # t table.
    assert minimum_detectable_effect(10.0, 9, 0.05) == pytest.approx((2.306004 + 0.888889) * 10 / 3, rel=1e-5)
    # A stricter level, or fewer clusters, needs a larger effect; none without two clusters or an sd.
    assert minimum_detectable_effect(10.0, 9, 0.005) > minimum_detectable_effect(10.0, 9, 0.05)
    assert minimum_detectable_effect(10.0, 4, 0.05) > minimum_detectable_effect(10.0, 9, 0.05)
    assert minimum_detectable_effect(10.0, 1, 0.05) is None and minimum_detectable_effect(None, 9, 0.05) is None


def _summary_of(rows: list[dict], contexts: list[str], clusters: list[str] | None = None, resamples: int = 500):
    import polars as pl

    from mascot.evaluation.results import build_summary
    from mascot.evaluation.scoring import SCORE_SCHEMA

    schema = dict(SCORE_SCHEMA) | ({"training_seed": pl.Int64} if "training_seed" in rows[0] else {})
    frame = pl.DataFrame({"context_id": contexts, "eval_set": ["held_out"] * len(contexts),
                          "cluster": clusters or contexts, "valence": [None] * len(contexts),
                          "meeting_type": [None] * len(contexts)},
                         schema_overrides={"valence": pl.String, "meeting_type": pl.String})
    played = pl.DataFrame({"role": ["companion"], "reasoning_marked": [None]},
                          schema_overrides={"reasoning_marked": pl.Boolean})
    systems = sorted({row["system"] for row in rows}, key=["mascot", "mascot_p", "zero_shot"].index)
    return build_summary("r", systems, [0, 1], {}, frame, pl.DataFrame(rows, schema=schema), played,
                         resamples=resamples)["results"]["held_out"]


def _one_run_rows() -> list[dict]:
    """8 contexts in 6 meetings, 2 evaluation seeds, MASCOT, MASCOT-P and Zero-Shot, one Zero-Shot conversation
    missing: the frame whose figures the code before training seeds gave (below)."""
    rng = np.random.default_rng(7)
    rows = []
    for c in range(8):
        for seed in (0, 1):
            for system, shift in (("mascot", 6.0), ("mascot_p", 3.0), ("zero_shot", 0.0)):
                if (c, seed, system) == (2, 1, "zero_shot"):
                    continue
                rows.append({"system": system, "context_id": f"c{c}", "seed": seed, "level": "persona",
                             "metric": "overall", "judge": "j", "value": round(50 + shift + 10 * rng.normal(), 2)})
    return rows


def test_with_one_training_seed_every_figure_is_the_one_computed_before_training_seeds():
    contexts, clusters = [f"c{c}" for c in range(8)], ["m0", "m0", "m1", "m2", "m3", "m3", "m4", "m5"]
    # Computed on this frame by the code before eval.training_seeds (commit ed261bb's mascot/evaluation).
    before = {"summaries": [["mascot", 52.230625, 48.41629761904762, 57.256765625],
                            ["mascot_p", 47.76625, 42.10972916666667, 52.847036363636356],
                            ["zero_shot", 48.85933333333334, 44.89785714285715, 52.845000000000006]],
              "comparisons": [["mascot_p", 6.4170833333333315, -1.9812500000000028, 15.713833333333334, 0.375, 16, 0],
                              ["zero_shot", 3.3941666666666648, -1.3355833333333353, 7.453749999999999, 0.28125, 15,
                               1]]}
    for rows in (_one_run_rows(), [row | {"training_seed": 0} for row in _one_run_rows()]):
        result = _summary_of(rows, contexts, clusters)
        assert [[e["system"], e["mean"], e["ci_low"], e["ci_high"]] for e in result["summaries"]] \
            == before["summaries"]
        assert [[e["baseline"], e["mean"], e["ci_low"], e["ci_high"], e["p"], e["pairs"], e["unpaired"]]
                for e in result["comparisons"]] == before["comparisons"]
        assert {e["training_seeds"] for e in result["summaries"] + result["comparisons"]} == {1}
        assert {e["interval"] for e in result["summaries"]} == {"percentile bootstrap over clusters"}


def test_training_seeds_that_differ_widen_the_interval_and_an_ablation_meets_mascot_run_by_run():
    """Three training runs of MASCOT whose luck differs by 15 points, on 12 contexts that differ little: the interval
    resamples the runs and is wider than the one of each context's mean over the runs; MASCOT-P, an ablation of the
    same runs, is paired with MASCOT run by run, so the runs' luck cancels from their difference."""
    rng = np.random.default_rng(1)
    contexts, offsets = [f"c{c}" for c in range(12)], (-15.0, 0.0, 15.0)
    base = {c: 50 + rng.normal() for c in contexts}
    rows, means = [], []
    for c in contexts:
        common = {"context_id": c, "seed": 0, "level": "persona", "metric": "overall", "judge": "j"}
        runs = [base[c] + offset + rng.normal() for offset in offsets]
        for run, value in enumerate(runs):
            rows.append(common | {"system": "mascot", "training_seed": run, "value": value + 5})
            rows.append(common | {"system": "mascot_p", "training_seed": run, "value": value + 2})
        rows.append(common | {"system": "zero_shot", "training_seed": 0, "value": base[c]})
        means += [common | {"system": "mascot", "training_seed": 0, "value": float(np.mean(runs)) + 5},
                  common | {"system": "zero_shot", "training_seed": 0, "value": base[c]}]
    three, pooled = _summary_of(rows, contexts), _summary_of(means, contexts)

    def width(entry):
        return entry["ci_high"] - entry["ci_low"]

    mascot = next(e for e in three["summaries"] if e["system"] == "mascot")
    mascot_mean = next(e for e in pooled["summaries"] if e["system"] == "mascot")
    assert mascot["training_seeds"] == 3 and "training seeds" in mascot["interval"]
    assert mascot["mean"] == pytest.approx(mascot_mean["mean"])
    assert width(mascot) > 3 * width(mascot_mean)
    against = {e["baseline"]: e for e in three["comparisons"]}
    against_mean = {e["baseline"]: e for e in pooled["comparisons"]}
    zero_shot = against["zero_shot"]
    assert zero_shot["training_seeds"] == 3 and zero_shot["pairs"] == 36
    assert zero_shot["mean"] == pytest.approx(against_mean["zero_shot"]["mean"]) == pytest.approx(5, abs=1)
    assert width(zero_shot) > 3 * width(against_mean["zero_shot"])
    assert zero_shot["ci_low"] < 0 < zero_shot["ci_high"], "three runs 15 points apart cannot tell 5 from 0"
    ablation = against["mascot_p"]
    assert ablation["pairs"] == 36 and ablation["mean"] == pytest.approx(3, abs=0.5)
    assert width(ablation) < 2 and ablation["ci_low"] > 0
