"""Episodes' prompts: the Speaker conditioned on its persona and the directive, the simulated user in
character, and a sampled directive read as written (valid, or the flagged fallback)."""

from __future__ import annotations

import json

from test_cli import REPO

from mascot.data.context import Context, Message
from mascot.dialogue.directives import FALLBACK_INSTRUCTION, fallback_speaker, read_reply
from mascot.dialogue.episodes import alternating, companion_messages, describe_big_five, user_messages
from mascot.dialogue.turns import Directive, Turn, opening_turns
from mascot.roster import BigFive, load_roster, load_user_profiles
from mascot.stage2.director import fallback_seed, sampled_validity

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
PROFILES = load_user_profiles(REPO / "configs" / "users" / "big_five.yaml").profiles
CONTEXT = Context(id="c1", domain="emotional_support", source="test", split="train",
                  history=[Message(role="user", content="I failed my exam and I feel stupid.")])
EPISODE = [*opening_turns(CONTEXT), Turn("anchor", "That sounds really heavy."),
           Turn("catalyst", "What part felt hardest?"), Turn("user", "The timing, mostly.", role="user")]


def test_the_speaker_answers_the_directive_in_character_with_the_conversation_alternating():
    directive = Directive(next_speaker="anchor", instruction="Reflect how tired they sound.", tone="gentle")
    messages = companion_messages(ROSTER.get("anchor"), ROSTER, CONTEXT, EPISODE, directive)
    system = messages[0]["content"]
    assert "You are The Anchor" in system and "Reflect how tired they sound. Tone: gentle." in system
    roles = [m["role"] for m in messages[1:]]
    assert roles == ["user", "assistant", "user"]  # the Catalyst's turn and the user's turn are one message
    assert messages[-1]["content"] == "The Catalyst: What part felt hardest?\nThe timing, mostly."
    # Without a directive the prompt is Stage 1's, byte for byte.
    assert companion_messages(ROSTER.get("anchor"), ROSTER, CONTEXT, EPISODE[:1], None)[0]["content"] \
        == companion_messages(ROSTER.get("anchor"), ROSTER, CONTEXT, [], None)[0]["content"]
    assert "director" not in companion_messages(ROSTER.get("anchor"), ROSTER, CONTEXT, [], None)[0]["content"]


def test_the_simulated_user_stays_in_character_with_its_profile_in_words():
    profile = next(p for p in PROFILES if p.id == "anxious_student")
    messages = user_messages(profile, ROSTER, CONTEXT, EPISODE)
    system = messages[0]["content"]
    assert system.startswith("You are Maya.") and "high neuroticism" in system and "low extraversion" in system
    assert "Never act as a helper" in system
    assert [m["role"] for m in messages[1:]] == ["assistant", "user", "assistant"]
    assert messages[2]["content"] == "The Anchor: That sounds really heavy.\nThe Catalyst: What part felt hardest?"
    assert "the person in this conversation" in user_messages(None, ROSTER, CONTEXT, EPISODE)[0]["content"]


def test_big_five_levels():
    traits = BigFive(openness=0.9, conscientiousness=0.5, extraversion=0.1, agreeableness=2 / 3, neuroticism=1 / 3)
    assert describe_big_five(traits) == ("high openness, moderate conscientiousness, low extraversion, "
                                         "high agreeableness, low neuroticism")


def test_alternating_keeps_system_messages_apart():
    merged = alternating([{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
                          {"role": "user", "content": "c"}, {"role": "user", "content": "d"}])
    assert merged == [{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
                      {"role": "user", "content": "c\nd"}]


def test_a_sampled_directive_is_read_as_written_and_an_invalid_one_is_the_flagged_fallback():
    valid = json.dumps({"next_speaker": "beacon", "instruction": "Name one strength.", "tone": None})
    reply = read_reply(valid, ROSTER, EPISODE, None)
    assert not reply.fallback and reply.directive.next_speaker == "beacon" and reply.attempts == 1
    for invalid in ("", '{"next_speaker": "anchor"', '{"next_speaker": "therapist", "instruction": "Help."}'):
        reply = read_reply(invalid, ROSTER, EPISODE, None)
        # The documented fallback: the seeded random persona for this conversation and seed.
        assert reply.fallback and reply.error and reply.directive.next_speaker == fallback_speaker(ROSTER, EPISODE, None)
        assert reply.directive.instruction == FALLBACK_INSTRUCTION
    # In a rollout the fallback is drawn with the sampled text's and the draw's seed, not the state's: the invalid
    # directives of one state meet every persona, so being invalid pays no state's fitting persona by rule.
    invalid = [f'{{"next_speaker": "anchor", "instr {i}' for i in range(30)]
    drawn = [read_reply(text, ROSTER, EPISODE, fallback_seed(text, 0)) for text in invalid]
    assert {reply.directive.next_speaker for reply in drawn} == {"anchor", "catalyst", "beacon"}
    assert len({fallback_seed(invalid[0], draw) for draw in range(3)}) == 3
    assert [read_reply(text, ROSTER, EPISODE, fallback_seed(text, 0)) for text in invalid] == drawn
    assert all(reply.fallback and reply.seed is None for reply in drawn)  # a given sample has no request seed
    # The format reward counts only the sampled directive, the trajectory's first: later valid ones do not pay
    # for an invalid first, nor later invalid ones cost a valid first.
    later = [Turn("anchor", "y"), Turn("user", "z", role="user"), Turn("catalyst", "w")]
    assert sampled_validity([Turn("beacon", "x", fallback=True), *later]) == 0.0
    assert sampled_validity([Turn("beacon", "x"), Turn("anchor", "y", fallback=True)]) == 1.0


def test_the_group_reward_model_reads_the_trajectory_up_to_the_companions_last_turn(tiny_models):
    """The score is read at the last token: the simulated user's reply after the companions' turns is not
    part of what the group reward model scores, and a companion's turn is."""
    from mascot.stage2.trajectories import trajectory_prompt, trajectory_text
    from mascot.train.reward_model import RewardModelScorer

    roster = ROSTER
    state = [Turn("user", "I failed my exam and I feel stupid.", role="context")]
    companions = [Turn("anchor", "That sounds really heavy."), Turn("user", "It is.", role="user"),
                  Turn("catalyst", "What would help you feel ready next time?")]
    replies = [[*companions, Turn("user", reply, role="user")] for reply in ("Thanks, that helps.", "Whatever.")]
    texts = [trajectory_text(roster, trajectory) for trajectory in replies]
    assert texts[0] == texts[1] and texts[0].endswith("The Catalyst: What would help you feel ready next time?")
    assert "User: It is." in texts[0]  # a user's turn between companion turns stays
    scorer = RewardModelScorer(tiny_models.rm, name="group_rm")
    other = trajectory_text(roster, [*companions[:2], Turn("catalyst", "Let us plan one small step.")])
    scores = scorer.score([trajectory_prompt(roster, state)] * 3, [*texts, other])
    assert scores[0] == scores[1] and scores[2] != scores[0]
