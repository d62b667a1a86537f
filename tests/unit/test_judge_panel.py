"""The judge panel: concurrent judging in a stable order, the judgments table, aggregation,
agreement between judges and the failure-rate guard. Expected numbers are worked out by hand."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import polars as pl
import pytest

from mascot.config import BackendConfig, JudgeConfig
from mascot.data.context import Context, Message
from mascot.judges import HeuristicJudge, JudgeItem, Judgment, judge_items
from mascot.judges.llm_judge import LLMJudge
from mascot.judges.panel import (
    JudgeFailureRateExceeded,
    JudgePanel,
    PanelSpec,
    aggregate_scores,
    agreement,
    check_failure_rate,
    failure_rate,
    judgments_frame,
    make_judge,
    make_panel,
)
from mascot.queries import Query, request_seed
from mascot.roster import load_roster
from mascot.rubrics import load_rubric
from mascot.stage1.candidates import Candidates

ROOT = Path(__file__).resolve().parents[2]
RUBRIC = load_rubric(ROOT / "configs" / "rubrics" / "emotional_support.yaml")
ROSTER = load_roster(ROOT / "configs" / "rosters" / "emotional_support.yaml")
CONTEXT = Context(id="c1", domain="emotional_support", source="test", split="train",
                  history=[Message(role="user", content="I lost my job today and I feel awful.")])


def item(query_id="c1|anchor", idx=0, text="That sounds awful; losing your job hurts.") -> JudgeItem:
    return JudgeItem(query_id, idx, CONTEXT, ROSTER.get("anchor"), text)


def verdict(judge: str, query_id: str, idx: int, overall: float | None, error: str = "bad reply") -> Judgment:
    """A judgment whose criteria all equal `overall` (None: a failed judgment)."""
    target = item(query_id, idx)
    if overall is None:
        return Judgment.failed(target, judge, error, attempts=3)
    return Judgment.succeeded(target, judge, dict.fromkeys(RUBRIC.criterion_ids, overall), "fine")


def frame_of(table: dict[str, list[float | None]]) -> pl.DataFrame:
    """{judge: overall per candidate} for candidates q#0, q#1, ... into a judgments frame."""
    return judgments_frame([verdict(judge, "q", idx, value) for judge, values in table.items()
                            for idx, value in enumerate(values)], RUBRIC)


class DelayedJudge:
    """Finishes after `delay` seconds; records the seeds and how many judgments were in flight."""

    in_flight = 0
    peak = 0

    def __init__(self, name: str, delay: float):
        self.name, self.delay, self.seeds = name, delay, []

    async def judge(self, target: JudgeItem, seed: int) -> Judgment:
        DelayedJudge.in_flight += 1
        DelayedJudge.peak = max(DelayedJudge.peak, DelayedJudge.in_flight)
        self.seeds.append(seed)
        await asyncio.sleep(self.delay * (3 - target.candidate_idx))  # later items finish first
        DelayedJudge.in_flight -= 1
        return Judgment.succeeded(target, self.name, dict.fromkeys(RUBRIC.criterion_ids, 3), "ok")


def test_judge_all_runs_concurrently_and_keeps_item_then_judge_order():
    slow, fast = DelayedJudge("slow", 0.02), DelayedJudge("fast", 0.0)
    panel = JudgePanel([slow, fast])
    items = [item(idx=i) for i in range(3)]
    done = []
    judgments = asyncio.run(panel.judge_all(items, seed=5, on_done=done.append))
    assert [(j.candidate_idx, j.judge) for j in judgments] == [(i, name) for i in range(3) for name in ("slow", "fast")]
    assert DelayedJudge.peak == 6 and len(done) == 6
    assert [(j.candidate_idx, j.judge) for j in done] != [(j.candidate_idx, j.judge) for j in judgments]
    assert sorted(slow.seeds) == sorted(request_seed(5, "slow", "c1|anchor", str(i)) for i in range(3))
    assert set(slow.seeds).isdisjoint(fast.seeds)


def test_a_panel_needs_unique_judge_names_and_a_known_aggregation():
    with pytest.raises(ValueError, match="unique"):
        JudgePanel([HeuristicJudge(RUBRIC), HeuristicJudge(RUBRIC)])
    with pytest.raises(ValueError, match="at least one judge"):
        JudgePanel([])
    with pytest.raises(ValueError, match="aggregation"):
        JudgePanel([HeuristicJudge(RUBRIC)], aggregation="median")


def test_judge_items_flatten_sampled_candidates():
    group = Candidates(Query(CONTEXT, ROSTER.get("beacon")), ["first", "second"])
    items = judge_items([group])
    assert [(i.query_id, i.candidate_idx, i.candidate) for i in items] == [("c1|beacon", 0, "first"),
                                                                          ("c1|beacon", 1, "second")]


def test_judgments_frame_has_the_contract_columns_and_nulls_for_failures():
    frame = judgments_frame([verdict("a", "q", 0, 4.0), verdict("a", "q", 1, None, error="no JSON")], RUBRIC)
    assert frame.columns == ["query_id", "candidate_idx", "judge", *RUBRIC.criterion_ids, "overall", "feedback",
                             "ok", "error", "attempts"]
    assert all(frame.schema[c] == pl.Float64 for c in [*RUBRIC.criterion_ids, "overall"])
    failed = frame.row(1, named=True)
    assert failed["overall"] is None and all(failed[c] is None for c in RUBRIC.criterion_ids)
    assert (failed["ok"], failed["error"], failed["attempts"], failed["feedback"]) == (False, "no JSON", 3, "")
    empty = judgments_frame([], RUBRIC)
    assert empty.height == 0 and empty.schema == frame.schema


def test_judgments_frame_rejects_scores_for_another_rubric():
    odd = Judgment.succeeded(item(), "a", {"humour": 3.0}, "")
    with pytest.raises(ValueError, match="humour"):
        judgments_frame([odd], RUBRIC)


def test_mean_aggregation_skips_candidates_with_a_failed_judge():
    frame = frame_of({"a": [4, 2, 3], "b": [5, 3, None]})
    scores = aggregate_scores(frame, "mean")
    assert scores.columns == ["query_id", "candidate_idx", "overall", "n_judges"]
    assert scores.rows() == [("q", 0, 4.5, 2), ("q", 1, 2.5, 2)]  # q#2 is left out, not scored 0


def test_zscore_aggregation_standardises_each_judge_on_the_common_candidates():
    # a: 4, 2, 3 (and 5 on q#3, which b failed); b: 5, 4, 3. Over q#0..q#2 both have mean m and
    # population sd sqrt(2/3): a -> (+1.2247, -1.2247, 0), b -> (+1.2247, 0, -1.2247).
    frame = frame_of({"a": [4, 2, 3, 5], "b": [5, 4, 3, None]})
    scores = aggregate_scores(frame, "zscore")
    z = math.sqrt(1.5)
    assert scores["candidate_idx"].to_list() == [0, 1, 2]
    assert scores["overall"].to_list() == pytest.approx([z, -z / 2, -z / 2])
    # A judge that gives everyone the same score contributes 0, not a division by zero.
    flat = aggregate_scores(frame_of({"a": [4, 2], "c": [3, 3]}), "zscore")
    assert flat["overall"].to_list() == pytest.approx([0.5, -0.5])


def test_the_panel_decides_who_must_have_scored():
    frame = frame_of({"a": [4, 2]})
    assert aggregate_scores(frame, "mean", judges=["a", "b"]).height == 0  # b never scored
    panel = JudgePanel([HeuristicJudge(RUBRIC, name="a")], aggregation="mean")
    assert panel.aggregate(frame)["overall"].to_list() == [4.0, 2.0]


def test_agreement_matches_hand_computed_alpha_and_spearman():
    # Values 1,1,2,2,3,3,4,5: D_o = 2/8 (only q#3 disagrees, by 1), D_e = 222/56, alpha = 1 - 14/222.
    result = agreement(frame_of({"a": [1, 2, 3, 4], "b": [1, 2, 3, 5]}))
    assert result["n_judges"] == 2 and result["n_candidates"] == 4
    assert result["krippendorff_alpha"] == pytest.approx(1 - 14 / 222)
    assert result["mean_spearman"] == pytest.approx(1.0)
    # Opposite orders: D_o = 16/6, D_e = 48/30, alpha = -2/3; Spearman -1.
    result = agreement(frame_of({"a": [1, 2, 3], "b": [3, 2, 1]}))
    assert result["krippendorff_alpha"] == pytest.approx(-2 / 3)
    assert result["pairwise_spearman"] == {"a|b": pytest.approx(-1.0)}


def test_agreement_treats_failures_as_missing_and_averages_pairs():
    result = agreement(frame_of({"a": [1, 2, 3, 4], "b": [1, 2, 3, None], "c": [3, 2, 1, 1]}))
    assert result["pairwise_spearman"]["a|b"] == pytest.approx(1.0)
    assert result["pairwise_spearman"]["a|c"] == pytest.approx(-0.9486833)  # ranks (1,2,3,4) vs (4,3,1.5,1.5)
    assert result["mean_spearman"] == pytest.approx((1.0 - 0.9486833 - 1.0) / 3)
    assert -1.0 <= result["krippendorff_alpha"] < 0


def test_agreement_with_one_judge_or_no_variation_is_none_with_a_note():
    single = agreement(frame_of({"a": [1, 2, 3]}))
    assert single["krippendorff_alpha"] is None and single["mean_spearman"] is None
    assert "at least two judges" in single["note"]
    flat = agreement(frame_of({"a": [3, 3], "b": [3, 3]}))
    assert flat["krippendorff_alpha"] is None and flat["mean_spearman"] is None and flat["note"]


def test_failure_rate_and_the_guard():
    frame = frame_of({"gpt": [4, None, None, 3], "phi": [4, 4, 4, None]})
    assert failure_rate(frame) == pytest.approx(3 / 8)
    assert failure_rate(judgments_frame([], RUBRIC)) == 0.0
    assert check_failure_rate(frame, 0.5) == pytest.approx(3 / 8)
    with pytest.raises(JudgeFailureRateExceeded) as info:
        check_failure_rate(frame, 0.1)
    message = str(info.value)
    for part in ["3 of 8 judgments failed", "37.5%", "10.0%", "gpt 2/4", "phi 1/4", "bad reply",
                 "max_judge_failure_rate"]:
        assert part in message
    assert (info.value.failed, info.value.total, info.value.max_rate) == (3, 8, 0.1)


def test_make_panel_builds_the_configured_judges():
    spec = PanelSpec.load([JudgeConfig(kind="heuristic")], ROOT / "configs" / "rubrics" / "emotional_support.yaml")
    assert spec.rubric == RUBRIC
    panel = make_panel(spec, aggregation="zscore")
    assert isinstance(panel.judges[0], HeuristicJudge) and panel.names == ["heuristic"]
    assert panel.aggregation == "zscore"
    llm_config = JudgeConfig(kind="llm", name="local", max_attempts=2,
                             backend=BackendConfig(kind="transformers", model="/models/tiny-lm", device="cpu"))
    judge = make_judge(llm_config, RUBRIC)
    assert isinstance(judge, LLMJudge) and judge.name == "local" and judge.max_attempts == 2
    assert judge.backend.model == "/models/tiny-lm" and judge.params == llm_config.backend.params


def test_a_heuristic_panel_runs_end_to_end():
    texts = ["That sounds awful; losing your job really hurts, and it makes sense you feel this way.",
             "As an AI I hope this helps.", ""]
    items = [item(idx=i, text=t) for i, t in enumerate(texts)]
    panel = JudgePanel([HeuristicJudge(RUBRIC, name="h1"), HeuristicJudge(RUBRIC, name="h2")], "zscore")
    frame = judgments_frame(asyncio.run(panel.judge_all(items, seed=0)), RUBRIC)
    assert frame.height == 6 and failure_rate(frame) == 0.0
    scores = panel.aggregate(frame).sort("overall", descending=True)
    assert scores["candidate_idx"].to_list() == [0, 1, 2]
    assert agreement(frame)["mean_spearman"] == pytest.approx(1.0)
