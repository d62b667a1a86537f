"""Head-to-head preference: both orders, outcomes and position consistency by hand, and the LLM
pairwise judge's requests as a loopback server receives them."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import polars as pl
import pytest
from chat_server import make_app
from loopback_servers import serve
from test_cli import REPO

from mascot.config import JudgeConfig
from mascot.data.context import Context, Message
from mascot.dialogue.turns import Turn
from mascot.evaluation.pairwise import (
    PREFERENCE_SCHEMA,
    VERDICTS,
    Side,
    make_pairwise_judge,
    preference_results,
)
from mascot.roster import load_roster
from mascot.rubrics import load_rubric

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
ASSISTANT = load_roster(REPO / "configs" / "rosters" / "assistant_emotional_support.yaml")
RUBRIC = load_rubric(REPO / "configs" / "rubrics" / "group_emotional_support.yaml")
CONTEXT = Context(id="c1", domain="emotional_support", source="test", split="test",
                  history=[Message(role="user", content="I lost my job today and I feel numb.")])
GROUP = Side(ROSTER, [Turn("anchor", "That sounds like a shock; feeling numb makes sense."),
                      Turn("catalyst", "What is one small thing that could help you tonight?")])
SINGLE = Side(ASSISTANT, [Turn("assistant", "Sorry to hear that.")])


def rows(baseline: str, context: str, first: float | None, second: float | None) -> list[dict]:
    """Both orders of one pair, each verdict the side that gives MASCOT `score` in that order (None: failed)."""
    def winner(order: str, score: float | None) -> str | None:
        mine, theirs = ("A", "B") if order == "mascot_first" else ("B", "A")
        return None if score is None else "tie" if score == 0.5 else mine if score == 1 else theirs

    return [{"baseline": baseline, "context_id": context, "seed": 0, "order": order, "judge": "j",
             "winner": winner(order, score), "mascot": score, "reason": "", "ok": score is not None, "error": None,
             "attempts": 1} for order, score in (("mascot_first", first), ("mascot_second", second))]


def test_outcomes_and_position_consistency_by_hand():
    # win/win -> 1; win then loss (flips with the position) -> 0.5; tie/tie -> 0.5; loss/loss -> 0;
    # a failed order leaves its pair out.
    frame = pl.DataFrame([*rows("zero_shot", "a", 1, 1), *rows("zero_shot", "b", 1, 0), *rows("zero_shot", "c", 0.5, 0.5),
                          *rows("zero_shot", "d", 0, 0), *rows("zero_shot", "e", 1, None)], schema=PREFERENCE_SCHEMA)
    [result] = preference_results(frame)
    assert (result["wins"], result["ties"], result["losses"], result["n"], result["failed_pairs"]) == (1, 2, 1, 4, 1)
    assert result["win_rate"] == pytest.approx(0.5) and result["position_consistency"] == pytest.approx(0.75)
    assert result["contexts"] == 4 and result["ci_low"] <= 0.5 <= result["ci_high"]
    # The verdicts by side on the four judged pairs: a (A, B), b (A, A), c (tie, tie), d (B, A): 4 of 6 decisive
    # verdicts picked A. The failed pair's one verdict (A) is left out with its pair.
    side_a = result["side_a_share"]
    assert (side_a["share"], side_a["n"]) == (pytest.approx(4 / 6), 6) and side_a["ci_low"] <= 4 / 6 <= side_a["ci_high"]
    # Two meetings (a, b in one; c, d in the other): the interval resamples meetings, whose win rates are 0.75
    # and 0.25, so its ends are 0.25 and 0.75.
    [clustered] = preference_results(frame, resamples=400, clusters={"a": "m1", "b": "m1", "c": "m2", "d": "m2"})
    assert (clustered["win_rate"], clustered["contexts"]) == (pytest.approx(0.5), 4)
    assert (clustered["ci_low"], clustered["ci_high"]) == (0.25, 0.75)


def test_the_heuristic_pairwise_judge_cannot_favour_a_position():
    judge = make_pairwise_judge(JudgeConfig(kind="heuristic"), RUBRIC)
    first = asyncio.run(judge.compare(CONTEXT, GROUP, SINGLE, 0)).winner
    second = asyncio.run(judge.compare(CONTEXT, SINGLE, GROUP, 0)).winner
    assert {first, second} in ({"tie"}, {"A", "B"}) and (first == "tie") is (second == "tie")


def test_the_llm_pairwise_judge_sees_both_continuations_swapped():
    app = make_app(seconds_per_token=0.0)
    with serve(app) as url:
        config = JudgeConfig(kind="llm", name="sim-pairwise", backend={
            "kind": "openai", "model": "sim-chat", "base_url": f"{url}/v1", "params": {"max_new_tokens": 30}})
        judge = make_pairwise_judge(config, RUBRIC)
        verdicts = [asyncio.run(judge.compare(CONTEXT, a, b, 7)) for a, b in ((GROUP, SINGLE), (SINGLE, GROUP))]
        bodies = [json.loads(body) for body in app.state.stats.seen]
    assert all(v.winner in VERDICTS for v in verdicts)
    group_line, single_line = "[The Anchor] That sounds like a shock", "[Assistant] Sorry to hear that."
    a_sides = []
    for body in bodies:  # the server's record of bodies is not in arrival order
        content = body["messages"][1]["content"]
        a_part, b_part = content.split("<b>")
        assert (group_line in a_part) is (single_line in b_part) and (group_line in a_part) is not (group_line in b_part)
        a_sides.append(group_line in a_part)
    assert sorted(a_sides) == [False, True]  # each continuation was A once and B once
    assert bodies[0]["response_format"]["json_schema"]["schema"]["properties"]["winner"]["enum"] == list(VERDICTS)


def test_each_order_credits_mascot_with_the_side_it_was_shown_on(tmp_path):
    """MASCOT is A in one order and B in the other: a verdict for its conversation counts for it in both,
    read from the rows judge_preferences writes, against the judge's own verdict on the same sides."""
    from mascot.artifacts import write_parquet
    from mascot.config import DataConfig
    from mascot.data.contexts import read_contexts, write_contexts
    from mascot.evaluation.conversations import CONVERSATION_SCHEMA
    from mascot.evaluation.pairwise import PairwiseJob, judge_preferences

    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 2}})
    contexts = write_contexts(data, 0, tmp_path / "contexts.parquet")
    context_id = contexts.read_parquet()["context_id"][0]
    sides = {"mascot": GROUP, "zero_shot": Side(ASSISTANT, [Turn("assistant", "ok")])}
    played = [{"system": system, "context_id": context_id, "seed": 0, "role": "companion", "turn_idx": k,
               "speaker": turn.speaker, "text": turn.text, "request_seed": k, "fallback": False}
              for system, side in sides.items() for k, turn in enumerate(side.turns)]
    conversations = write_parquet(pl.DataFrame(played, schema=CONVERSATION_SCHEMA), tmp_path / "conversations.parquet")
    judge = JudgeConfig(kind="heuristic")
    job = PairwiseJob(judge=judge, rubric=RUBRIC, roster=ROSTER, assistant=ASSISTANT, contexts=contexts, seed=0,
                      requests=tmp_path / "requests.sqlite")
    frame = judge_preferences(job, conversations, tmp_path / "preferences.parquet").read_parquet()

    heuristic = make_pairwise_judge(judge, RUBRIC)
    context = read_contexts(contexts)[context_id]
    first = asyncio.run(heuristic.compare(context, sides["mascot"], sides["zero_shot"], 0)).winner
    assert first in ("A", "B"), "the two conversations must not tie for this test to read anything"
    by_order = {row["order"]: row for row in frame.iter_rows(named=True)}
    mascot_won = float(first == "A")
    assert by_order["mascot_first"]["winner"] == first and by_order["mascot_first"]["mascot"] == mascot_won
    assert by_order["mascot_second"]["winner"] == {"A": "B", "B": "A"}[first]
    assert by_order["mascot_second"]["mascot"] == mascot_won


def test_a_group_is_weighed_against_a_single_assistant_by_the_neutral_rubric(tmp_path):
    """Against a single assistant the judge weighs by the outcome for the user; between two groups, by the collective
    rubric. A report whose single-assistant comparison was weighed by the collective rubric says it is tilted."""
    from mascot.artifacts import write_parquet
    from mascot.config import DataConfig
    from mascot.data.contexts import write_contexts
    from mascot.evaluation.conversations import CONVERSATION_SCHEMA
    from mascot.evaluation.pairwise import PairwiseJob, judge_preferences
    from mascot.evaluation.report import rubric_lines

    neutral = load_rubric(REPO / "configs" / "rubrics" / "outcome_emotional_support.yaml")
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 2}})
    contexts = write_contexts(data, 0, tmp_path / "contexts.parquet")
    context_id = contexts.read_parquet()["context_id"][0]
    sides = {"mascot": GROUP, "multi_agent": GROUP, "zero_shot": SINGLE}
    played = [{"system": system, "context_id": context_id, "seed": 0, "role": "companion", "turn_idx": k,
               "speaker": turn.speaker, "text": turn.text, "request_seed": k, "fallback": False}
              for system, side in sides.items() for k, turn in enumerate(side.turns)]
    conversations = write_parquet(pl.DataFrame(played, schema=CONVERSATION_SCHEMA), tmp_path / "conversations.parquet")
    job = PairwiseJob(judge=JudgeConfig(kind="heuristic"), rubric=RUBRIC, neutral_rubric=neutral, roster=ROSTER,
                      assistant=ASSISTANT, contexts=contexts, seed=0, requests=tmp_path / "requests.sqlite")
    frame = judge_preferences(job, conversations, tmp_path / "preferences.parquet").read_parquet()
    used = dict(frame.select("baseline", "rubric").unique().iter_rows())
    assert used == {"multi_agent": RUBRIC.name, "zero_shot": neutral.name}
    results = {e["baseline"]: e for e in preference_results(frame, resamples=100, collective_rubric=RUBRIC.name)}
    assert results["zero_shot"]["rubric"] == neutral.name
    assert not any("by construction" in line for line in rubric_lines(list(results.values())))
    # Without a neutral rubric, the single assistant is weighed by the collective one, and the report says so.
    tilted = judge_preferences(job.model_copy(update={"neutral_rubric": None}), conversations,
                               tmp_path / "tilted.parquet").read_parquet()
    lines = rubric_lines(preference_results(tilted, resamples=100, collective_rubric=RUBRIC.name))
    assert any("Against Zero-Shot" in line and "favour the group by construction" in line for line in lines), lines
    assert set(neutral.criterion_ids) == {"felt_heard", "moved_forward", "safety", "on_topic"}


def test_the_length_controlled_win_rate_is_the_win_rate_at_equal_length_by_hand():
    """MASCOT wrote three times the baseline's words in three pairs and won them, a third of them in one and lost
    it: the raw win rate is 0.75, but the fit through (ln 3, 1) and (-ln 3, 0) crosses equal length at 0.5."""
    frame = pl.DataFrame([*rows("zero_shot", "a", 1, 1), *rows("zero_shot", "b", 1, 1), *rows("zero_shot", "c", 1, 1),
                          *rows("zero_shot", "d", 0, 0)], schema=PREFERENCE_SCHEMA)
    lengths = {**{("mascot", c, 0, 0): 29 for c in "abc"}, **{("zero_shot", c, 0, 0): 9 for c in "abc"},
               ("mascot", "d", 0, 0): 9, ("zero_shot", "d", 0, 0): 29}  # (29 + 1) / (9 + 1) = 3 (training seed 0)
    [result] = preference_results(frame, resamples=300, lengths=lengths)
    controlled = result["length_controlled"]
    assert result["win_rate"] == pytest.approx(0.75) and controlled["win_rate"] == pytest.approx(0.5)
    assert controlled["slope"] == pytest.approx(1 / (2 * np.log(3)))
    assert controlled["ci_low"] <= 0.5 <= controlled["ci_high"]
    # Equal lengths everywhere: the intercept is not identified, and nothing is claimed.
    flat = {key: 10 for key in lengths}
    [result] = preference_results(frame, resamples=50, lengths=flat)
    assert result["length_controlled"]["win_rate"] is None
    assert preference_results(frame, resamples=50)[0]["length_controlled"] is None, "no lengths given"
    from mascot.evaluation.report import companion_words

    played = pl.DataFrame({"system": ["mascot"] * 3, "context_id": ["a"] * 3, "seed": [0] * 3,
                           "role": ["companion", "user", "companion"], "text": ["one two", "not counted", "three"]})
    assert companion_words(played) == {("mascot", "a", 0, 0): 3}, "only the companions' words, as the judge weighs them"


def test_each_training_seed_of_mascot_meets_the_baseline_and_an_ablation_meets_it_seed_by_seed(tmp_path):
    """MASCOT and MASCOT-C played for training seeds 0 and 1, Zero-Shot once: the judge compares both of MASCOT's
    seeds with Zero-Shot's one conversation and with MASCOT-C's conversation of the same seed; the win rate counts
    every seed and its interval resamples the seeds as well as the contexts."""
    from mascot.artifacts import write_parquet
    from mascot.config import DataConfig
    from mascot.data.contexts import write_contexts
    from mascot.evaluation.conversations import CONVERSATION_SCHEMA
    from mascot.evaluation.pairwise import PairwiseJob, judge_preferences

    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 2}})
    contexts = write_contexts(data, 0, tmp_path / "contexts.parquet")
    context_id = contexts.read_parquet()["context_id"][0]
    played = [{"system": system, "context_id": context_id, "seed": 0, "role": "companion", "turn_idx": k,
               "speaker": turn.speaker, "text": f"{turn.text} ({system}, seed {run})", "request_seed": k,
               "fallback": False, "training_seed": run}
              for system, side, runs in (("mascot", GROUP, (0, 1)), ("mascot_c", GROUP, (0, 1)),
                                         ("zero_shot", SINGLE, (0,)))
              for run in runs for k, turn in enumerate(side.turns)]
    conversations = write_parquet(pl.DataFrame(played, schema=CONVERSATION_SCHEMA), tmp_path / "conversations.parquet")
    job = PairwiseJob(judge=JudgeConfig(kind="heuristic"), rubric=RUBRIC, roster=ROSTER, assistant=ASSISTANT,
                      contexts=contexts, seed=0, requests=tmp_path / "requests.sqlite")
    frame = judge_preferences(job, conversations, tmp_path / "preferences.parquet").read_parquet()
    compared = sorted(frame.select("baseline", "training_seed").unique().iter_rows())
    assert compared == [("mascot_c", 0), ("mascot_c", 1), ("zero_shot", 0), ("zero_shot", 1)]
    assert frame.height == 4 * 2  # both orders of each
    results = {e["baseline"]: e for e in preference_results(frame, resamples=100)}
    assert results["zero_shot"]["n"] == 2 and results["zero_shot"]["training_seeds"] == 2
    assert results["zero_shot"]["interval"] == "percentile bootstrap over contexts and training seeds, crossed"
