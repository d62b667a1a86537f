"""The GRPO reward terms that need no model: format and conciseness."""

from __future__ import annotations

import pytest

from mascot.stage1.rewards import ConcisenessReward, FormatReward

PERSONAS = ["The Anchor", "The Catalyst", "The Beacon"]
fmt = FormatReward(PERSONAS)


def test_a_clean_reply_passes_every_rule():
    text = "That sounds exhausting. It makes sense that you feel worn down after a week like that."
    assert fmt.checks(text) == dict.fromkeys(fmt.checks(text), True)
    assert fmt.score(text) == 1.0


@pytest.mark.parametrize("text, broken", [
    ("Anchor: That sounds hard.", "no_role_label"),
    ("The Beacon: You can grow from this.", "no_role_label"),
    ("**The Catalyst:** What would help?", "no_role_label"),
    ("[Anchor] I hear you.", "no_role_label"),
    ("I hear you.\nAssistant: Anything else?", "no_role_label"),
    ("<think>They are sad.</think> I hear you.", "no_reasoning_block"),
    ("I hear you.<|im_end|>", "no_reasoning_block"),
    ("As an AI, I cannot feel, but that sounds hard.", "no_meta_talk"),
    ("Speaking as a persona, I would say it is fine.", "no_meta_talk"),
    ("That sounds hard, and I think that you", "clean_ending"),
    ("", "clean_ending"),
])
def test_each_broken_rule_costs_a_quarter(text, broken):
    checks = fmt.checks(text)
    assert not checks[broken]
    assert fmt.score(text) == pytest.approx(sum(checks.values()) / 4) and fmt.score(text) < 1.0


def test_a_colon_in_ordinary_prose_is_not_a_role_label():
    assert fmt.checks("Here is one idea: take a short walk tonight.")["no_role_label"]
    assert fmt.checks("Anchoring yourself helps: breathe slowly.")["no_role_label"]


def test_rewards_take_trl_conversational_completions():
    prompts = [[{"role": "user", "content": "hi"}]] * 2
    completions = [[{"role": "assistant", "content": "Hello there."}], [{"role": "assistant", "content": "Anchor: hi"}]]
    assert fmt(prompts, completions) == [1.0, 0.5]


def test_conciseness_is_one_inside_the_band_and_falls_off_outside():
    reward = ConcisenessReward(min_words=4, max_words=10)
    assert reward.score("one two three four") == 1.0
    assert reward.score(" ".join(["w"] * 10)) == 1.0
    assert reward.score("one two") == 0.5
    assert reward.score("") == 0.0
    assert reward.score(" ".join(["w"] * 15)) == 0.5
    assert reward.score(" ".join(["w"] * 25)) == 0.0
    assert reward([[]], ["one two three four five"]) == [1.0]
