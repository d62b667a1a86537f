"""The before/after statistics, on hand-made scores (the end-to-end run is an integration test)."""

from __future__ import annotations

import polars as pl
import pytest

from mascot.config import BeforeAfterConfig
from mascot.stage1.before_after import SCORES, before_after_metrics


def samples(n_prompts: int = 12, gain: float = 0.5) -> pl.DataFrame:
    rows = []
    for prompt in range(n_prompts):
        for policy, shift in (("base", 0.0), ("speaker", gain)):
            for sample in range(2):
                value = prompt % 5 + shift + 0.1 * sample
                rows.append({"query_id": f"c{prompt}|anchor", "persona": ["anchor", "beacon"][prompt % 2],
                             "policy": policy, "sample_idx": sample, "text": "t",
                             **dict.fromkeys(SCORES, value)})
    return pl.DataFrame(rows)


def test_each_score_gets_policy_means_and_a_paired_difference():
    metrics = before_after_metrics(samples(), BeforeAfterConfig(bootstrap_resamples=500), seed=0, judge_failures=0)
    assert metrics["prompts"] == 12
    for score in SCORES:
        result = metrics["scores"][score]
        assert result["base"]["n"] == result["speaker"]["n"] == result["difference"]["n"] == 12
        assert result["difference"]["mean"] == pytest.approx(0.5)
        assert result["difference"]["ci_low"] == result["difference"]["ci_high"] == pytest.approx(0.5)
    assert metrics["by_persona"]["anchor"]["reward"]["n"] == 6


def test_row_order_does_not_change_the_intervals():
    frame = samples(gain=0.0).with_columns(
        pl.when(pl.col("policy") == "speaker").then(pl.col("judge") + pl.col("sample_idx") * 0.3 - (pl.col("query_id").str.len_chars() % 3) * 0.2)
        .otherwise(pl.col("judge")).alias("judge"))
    config = BeforeAfterConfig(bootstrap_resamples=500)
    reference = before_after_metrics(frame, config, seed=0, judge_failures=0)
    assert reference["scores"]["judge"]["difference"]["ci_low"] < reference["scores"]["judge"]["difference"]["ci_high"]
    for seed in range(3):
        shuffled = frame.sample(fraction=1.0, shuffle=True, seed=seed)
        assert before_after_metrics(shuffled, config, seed=0, judge_failures=0) == reference


def test_a_failed_judgment_leaves_its_prompt_out_of_the_judge_comparison_only():
    frame = samples().with_columns(
        pl.when(pl.col("query_id") == "c0|anchor").then(None).otherwise(pl.col("judge")).alias("judge"))
    metrics = before_after_metrics(frame, BeforeAfterConfig(bootstrap_resamples=500), seed=0, judge_failures=4)
    assert metrics["scores"]["judge"]["difference"]["n"] == 11
    assert metrics["scores"]["persona_rm"]["difference"]["n"] == 12
    assert metrics["judge_failures"] == 4


def test_the_interval_resamples_the_contexts_clusters_where_a_meeting_has_several_windows():
    # 12 contexts, windows of 3 meetings: the prompts of one meeting move together, so the interval counts 3 units.
    meetings = {f"c{prompt}": f"meeting{prompt % 3}" for prompt in range(12)}
    config = BeforeAfterConfig(bootstrap_resamples=500)
    by_meeting = before_after_metrics(samples(), config, seed=0, judge_failures=0, clusters=meetings)
    by_context = before_after_metrics(samples(), config, seed=0, judge_failures=0)
    assert by_meeting["scores"]["judge"]["difference_by_context"]["clusters"] == 3
    assert by_context["scores"]["judge"]["difference_by_context"]["clusters"] == 12
    with pytest.raises(KeyError, match="c11"):  # a context the table does not know is a bug, not its own cluster
        before_after_metrics(samples(), config, seed=0, judge_failures=0,
                             clusters={c: m for c, m in meetings.items() if c != "c11"})
