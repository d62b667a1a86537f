"""The Stage 2 report: directive validity and fallbacks, and the Director's before/after, each with n and an interval."""

from __future__ import annotations

import polars as pl
import pytest
from test_cli import REPO

from mascot.config import BeforeAfterConfig
from mascot.rubrics import load_rubric
from mascot.stage2.branching import EPISODE_SCHEMA
from mascot.stage2.director_eval import director_metrics, reward_signal
from mascot.stage2.report import (
    director_eval_markdown,
    first_speaker_scores,
    reward_signal_lines,
    stage2_markdown,
    stage2_summary,
)
from mascot.stage2.trajectories import MESSAGES

RUBRIC = load_rubric(REPO / "configs" / "rubrics" / "group_emotional_support.yaml")


def episodes() -> pl.DataFrame:
    rows = []
    for episode in range(4):
        for turn in range(3):
            fallback = episode == 0 and turn == 0  # one fallback in twelve companion turns
            rows.append({"episode_id": f"e{episode}", "context_id": f"e{episode}", "state_id": f"e{episode}|t4",
                         "user_profile": None, "branch": None if turn == 0 else turn - 1, "block": 0,
                         "turn_idx": turn, "role": "companion", "speaker": "anchor", "text": "hi", "seed": 1,
                         "directive": "{}", "director_seed": 2, "directive_attempts": 3 if fallback else 1,
                         "fallback": fallback})
    return pl.DataFrame(rows, schema=EPISODE_SCHEMA)


def test_directive_validity_and_fallbacks_are_counted_with_intervals_and_no_pairs_is_not_an_error():
    judgments = pl.DataFrame({"query_id": ["e0|t4"], "candidate_idx": [0], "judge": ["h"],
                              **{c: [3.0] for c in RUBRIC.criterion_ids}, "overall": [3.0], "feedback": [""],
                              "ok": [True], "error": [None], "attempts": [1]})
    pairs = pl.DataFrame(schema={"query_id": pl.String, "persona": pl.String, "prompt": MESSAGES, "chosen": pl.String,
                                 "rejected": pl.String, "margin": pl.Float64, "chosen_score": pl.Float64,
                                 "rejected_score": pl.Float64, "director_prompt": MESSAGES,
                                 "chosen_directive": pl.String, "rejected_directive": pl.String,
                                 "chosen_fallback": pl.Boolean, "rejected_fallback": pl.Boolean})
    # Four contexts, two windows of each of two meetings: the intervals resample the meetings.
    clusters = {"e0": "m0", "e1": "m0", "e2": "m1", "e3": "m1"}
    summary = stage2_summary(RUBRIC, "mean", episodes(), judgments, pairs, {"hits": 0, "misses": 12}, clusters)
    directives = summary["directives"]
    assert directives["turns"] == 12 and directives["fallbacks"] == 1 and directives["attempts"] == {"1": 11, "3": 1}
    assert directives["valid"]["value"] == 11 / 12 and directives["valid"]["clusters"] == 2
    assert directives["valid"]["ci_low"] <= 11 / 12 <= directives["valid"]["ci_high"]
    summary["director_method"] = "grpo"
    text = stage2_markdown(summary)
    assert "Valid directives (no fallback): 91.7% [" in text and "(n=12 from 2 clusters)" in text
    assert "Fallbacks (a seeded random persona, after every attempt failed): 1 of 12" in text
    assert "Trajectory pairs: 0 from 0 of 4 states" in text
    assert "by who spoke first in it (95% bootstrap interval over clusters): anchor +0.000 [no interval] (n=1)." in text


def test_the_judges_worth_of_the_first_choice_is_each_trajectorys_score_less_its_states_mean_by_its_first_speaker():
    # 3 contexts, 2 states each, 4 branches: the Beacon or the Anchor speaks first, then the Catalyst.
    rows, scores = [], []
    for context in range(3):
        for state in (f"c{context}|t3", f"c{context}|t6"):
            for branch in range(4):
                first = "beacon" if branch % 2 else "anchor"
                for turn, speaker in ((8, "catalyst"), (7, first)):  # the later turn listed first: order by turn
                    rows.append({"episode_id": f"c{context}", "context_id": f"c{context}", "state_id": state,
                                 "branch": branch, "turn_idx": turn, "role": "companion", "speaker": speaker})
                # The judge favours the Beacon first by 1 point at every state, on top of the state's own level.
                # A panel of two judges; the second failed on branch 0, which the panel, as the pairs, leaves out.
                for judge in ("h", "g"):
                    ok = judge == "h" or branch != 0
                    scores.append({"query_id": state, "candidate_idx": branch, "judge": judge, "ok": ok,
                                   "overall": context + (3.0 if first == "beacon" else 2.0) if ok else None})
    first = first_speaker_scores(pl.DataFrame(rows, schema_overrides={"branch": pl.Int64}), pl.DataFrame(scores),
                                 "mean", {f"c{i}": f"c{i}" for i in range(3)})
    assert list(first) == ["anchor", "beacon"]  # the Catalyst never speaks first
    # Each state keeps one Anchor-first branch and two Beacon-first ones: its mean is a third of a point above 2.
    assert first["beacon"]["value"] == pytest.approx(1 / 3) and first["anchor"]["value"] == pytest.approx(-2 / 3)
    assert first["beacon"]["n"] == 12 and first["anchor"]["n"] == 6 and first["beacon"]["clusters"] == 3
    assert first["beacon"]["ci_low"] == pytest.approx(1 / 3) and first["anchor"]["ci_high"] == pytest.approx(-2 / 3)


def test_the_director_before_after_gives_each_score_and_validity_its_n_and_an_interval_over_contexts():
    # 6 states of 3 contexts, two states each: intervals resample the contexts.
    samples = pl.DataFrame({
        "state_id": [f"c{i // 2}|t{3 + 3 * (i % 2)}" for i in range(6) for _ in range(2)] * 2,
        "policy": ["base"] * 12 + ["director"] * 12, "sample_idx": [0, 1] * 12,
        "reward": [0.1] * 12 + [0.3, 0.5] * 6, "group_rm": [0.1] * 12 + [0.2] * 12,
        "format": [0.0, 1.0] * 6 + [1.0] * 12, "valid": [False, True] * 6 + [True] * 12,
        "text": [f"directive {i}" for i in range(24)], "group_rm_rollouts": [[0.1]] * 12 + [[0.2]] * 12})
    metrics = director_metrics(samples, BeforeAfterConfig(bootstrap_resamples=200), seed=0)
    assert metrics["states"] == 6 and metrics["fallbacks"] == {"base": 6, "director": 0}
    assert metrics["validity"]["base"]["value"] == 0.5 and metrics["validity"]["director"]["value"] == 1.0
    assert metrics["contexts"] == 3 and metrics["scores"]["group_rm"]["difference"]["n"] == 6
    assert metrics["scores"]["group_rm"]["by_context"]["clusters"] == 3
    text = "\n".join(director_eval_markdown(metrics))
    assert "6 held-out states of 3 held-out contexts" in text
    assert "| group_rm | 6 | 3 |" in text and "+0.100 [+0.100, +0.100]" in text
    assert "Directive validity (first directive): base 50.0% [" in text and "(n=12 from 3 clusters)" in text
    assert metrics["signal"]["rollout_sd"] is None and "Reward signal" not in text  # one rollout: no split

    # Contexts 0 and 1 are windows of one meeting: the intervals resample 2 meetings, not 3 contexts.
    meetings = director_metrics(samples, BeforeAfterConfig(bootstrap_resamples=200), seed=0,
                                clusters={"c0": "m0", "c1": "m0", "c2": "m1"})
    assert meetings["scores"]["group_rm"]["by_context"]["clusters"] == 2
    assert meetings["validity"]["base"]["clusters"] == 2 and meetings["contexts"] == 3
    one = director_metrics(samples, BeforeAfterConfig(bootstrap_resamples=200), seed=0, clusters=dict.fromkeys(
        ("c0", "c1", "c2"), "m0"))
    assert "| group_rm | 6 | 1 |" in "\n".join(director_eval_markdown(one)) and "+0.100 [no interval] |" in "\n".join(
        director_eval_markdown(one))


def test_the_reward_signal_separates_the_rollouts_noise_from_the_spread_between_directives():
    # Two states, two directives each, two draws. Directive effects 0 and 1 per state; each draw moves every
    # directive of a state alike (±0.1, shared seeds), and an interaction of ±0.05 does not cancel between them.
    effects = {("s0", 0): 0.0, ("s0", 1): 1.0, ("s1", 0): 2.0, ("s1", 1): 3.0}
    rollouts = [[m - 0.1 + (0.05 if i == 0 else -0.05), m + 0.1 - (0.05 if i == 0 else -0.05)]
                for (_, i), m in effects.items()]
    samples = pl.DataFrame({"state_id": [s for s, _ in effects], "sample_idx": [i for _, i in effects],
                            "text": [f"directive {i}" for _, i in effects], "valid": True,
                            "group_rm": [sum(r) / 2 for r in rollouts], "group_rm_rollouts": rollouts})
    signal = reward_signal(samples)
    assert signal["rollouts"] == 2 and signal["directives"] == 4 and signal["states"] == 2
    # Within a directive, its two rollouts differ by 0.1 or 0.3: variances 0.005 and 0.045, pooled 0.025.
    assert signal["rollout_sd"] == pytest.approx(0.025 ** 0.5)
    assert signal["unshared_sd"] == pytest.approx(0.01 ** 0.5)
    # Between the directives of a state: 0.5; the interaction's variance is 0.01, of which a mean of 2 keeps half.
    assert signal["directive_sd"] == pytest.approx(0.495 ** 0.5)
    # The shared part of the noise is not subtracted: without the interaction, the spread is all directive.
    shared = samples.with_columns(group_rm_rollouts=pl.Series([[m - 0.1, m + 0.1] for m in effects.values()]))
    assert reward_signal(shared)["directive_sd"] == pytest.approx(0.5 ** 0.5)
    same = samples.with_columns(group_rm=pl.lit(0.5), group_rm_rollouts=pl.lit([0.4, 0.6]))
    assert reward_signal(same)["directive_sd"] == 0.0  # no spread between directives: nothing to learn


def test_the_reward_signals_spread_counts_distinct_valid_directives_and_has_an_interval_over_contexts():
    # Per state: directives 0 and 1 differ by 1.0; directive 2 repeats directive 1's text, and 3 is invalid with a
    # wild score. Counted, the repeat would shrink the spread and the invalid one inflate it.
    rows = []
    for context in range(6):
        state = f"c{context}|t2"
        for index, (text, valid, mean) in enumerate([("a", True, 0.0), ("b", True, 1.0), ("b", True, 1.0),
                                                      ("x", False, 9.0)]):
            rows.append({"state_id": state, "sample_idx": index, "text": text, "valid": valid,
                         "group_rm": mean, "group_rm_rollouts": [mean - 0.1, mean + 0.1]})
    samples = pl.DataFrame(rows)
    signal = reward_signal(samples, resamples=200)
    assert signal["directives"] == 12  # 2 distinct valid directives of 6 states
    assert signal["directive_sd"] == pytest.approx(0.5 ** 0.5)  # the variance of (0, 1)
    low, high = signal["directive_sd_ci"]
    assert low == pytest.approx(0.5 ** 0.5) and high == pytest.approx(0.5 ** 0.5)  # every context alike
    # Contexts that disagree give an interval around the estimate, its upper end a bound where the estimate is 0.
    flat = samples.with_columns(group_rm_rollouts=pl.when(pl.col("state_id").str.starts_with("c0"))
                                .then(pl.col("group_rm_rollouts")).otherwise(pl.lit([0.4, 0.6])))
    signal = reward_signal(flat, resamples=200)
    low, high = signal["directive_sd_ci"]
    assert low == 0.0 < signal["directive_sd"] <= high
    # Windows of one meeting are one unit: the six contexts as two meetings give another interval, and as one
    # meeting none.
    meetings = {f"c{context}": f"m{context % 2}" for context in range(6)}
    assert reward_signal(flat, resamples=200, clusters=meetings)["directive_sd_ci"] != signal["directive_sd_ci"]
    alone = reward_signal(flat, resamples=200, clusters=dict.fromkeys(meetings, "m0"))
    assert alone["directive_sd"] == signal["directive_sd"] and alone["directive_sd_ci"] is None
    assert f"differ by sd {alone['directive_sd']:.3f} [no interval: one cluster]" in reward_signal_lines(alone)[1]
    assert f"[{low:.3f}, {high:.3f}] beyond that noise (bootstrap over clusters" in reward_signal_lines(signal)[1]
    # One distinct valid directive per state: the spread between directives is undefined, and the report says so.
    single = reward_signal(samples.filter(pl.col("text") == "a"), resamples=200)
    assert single["rollout_sd"] is not None and single["directive_sd"] is None
