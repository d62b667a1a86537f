"""The planted group judge: a block's score says only whether its first companion fits the context's cue, and its
controls reverse that or cut it."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from stage1_runs import REPO

from mascot.config import JudgeConfig
from mascot.data.context import Context, Message
from mascot.dialogue.turns import Turn
from mascot.judges.group import BlockItem
from mascot.judges.panel import judge_rubric_problem, make_judge
from mascot.roster import load_roster
from mascot.rubrics import load_rubric

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
RUBRIC = load_rubric(REPO / "configs" / "rubrics" / "group_emotional_support.yaml")
PREFER = {"listen": "anchor", "next_step": "catalyst"}


def item(first: str, cue: str | None = "listen", branch: int = 0) -> BlockItem:
    context = Context(id="c1", domain="emotional_support", source="test", split="train",
                      history=[Message(role="user", content="can you just listen?")],
                      metadata={} if cue is None else {"cue": cue})
    block = [Turn(first, "a reply"), Turn("user", "ok", role="user"), Turn("beacon", "another")]
    return BlockItem("c1|t1", branch, context, ROSTER, [], block)


def overall(control: str | None, block: BlockItem) -> float | None:
    judge = make_judge(JudgeConfig(kind="planted", prefer=PREFER, control=control), RUBRIC, level="block")
    return asyncio.run(judge.judge(block, seed=0)).overall


def test_the_first_companion_that_fits_the_cue_scores_the_top_and_any_other_the_bottom():
    assert overall(None, item("anchor")) == RUBRIC.scale_max
    assert overall(None, item("catalyst")) == RUBRIC.scale_min
    assert overall(None, item("catalyst", cue="next_step")) == RUBRIC.scale_max


def test_the_flipped_control_scores_the_opposite_and_the_shuffled_one_ignores_the_block():
    assert overall("flipped", item("anchor")) == RUBRIC.scale_min
    assert overall("flipped", item("catalyst")) == RUBRIC.scale_max
    # The coin depends on the item's id only: the same branch scores alike whoever speaks first, and across
    # branches it lands high about as often as a persona drawn at random fits (1 in 3).
    assert overall("shuffled", item("anchor", branch=5)) == overall("shuffled", item("catalyst", branch=5))
    highs = sum(overall("shuffled", item("anchor", branch=b)) == RUBRIC.scale_max for b in range(300))
    assert 70 <= highs <= 130


def test_a_context_without_a_cue_is_a_failed_judgment_and_the_kind_is_for_blocks_with_prefer_only():
    judge = make_judge(JudgeConfig(kind="planted", prefer=PREFER), RUBRIC, level="block")
    judgment = asyncio.run(judge.judge(item("anchor", cue=None), seed=0))
    assert not judgment.ok and "no cue" in judgment.error
    assert "not one persona's reply" in judge_rubric_problem(JudgeConfig(kind="planted", prefer=PREFER), RUBRIC, "reply")
    with pytest.raises(ValidationError, match="needs 'prefer'"):
        JudgeConfig(kind="planted")
    with pytest.raises(ValidationError, match="only used with kind: planted"):
        JudgeConfig(kind="heuristic", control="flipped")
