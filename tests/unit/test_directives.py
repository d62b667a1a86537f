"""The Director's directives: parsing and validation, retries with a repair turn, the flagged fallback."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from chat_server import make_app
from loopback_servers import serve
from test_cli import REPO

from mascot.dialogue.directives import (
    direct,
    director_messages,
    fallback_speaker,
    parse_directive,
)
from mascot.dialogue.turns import Turn
from mascot.llm import normalize_messages
from mascot.llm.openai_backend import OpenAIBackend
from mascot.llm.structured import ReplyError
from mascot.roster import load_roster

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
TURNS = [Turn("user", "I failed my exam and I feel stupid."), Turn("anchor", "That sounds really heavy."),
         Turn("user", "Yeah."), Turn("catalyst", "What would help you feel ready next time?")]


class ScriptedDirector:
    """Backend stand-in: answers each request with the next scripted reply, records the requests."""

    model = "scripted-director"

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []

    async def generate(self, messages, n, params, seed, response_format=None):
        self.requests.append({"messages": normalize_messages(messages), "seed": seed, "format": response_format})
        return [self.replies.pop(0)] * n


def test_a_directive_is_found_wherever_the_reply_puts_it():
    reply = '<think>Beacon has not spoken.</think>```json\n{"next_speaker": "beacon", "instruction": " Name one ' \
            'small next step. ", "tone": null}\n```'
    directive = parse_directive(reply, ROSTER)
    assert (directive.next_speaker, directive.instruction, directive.tone) == ("beacon", "Name one small next step.",
                                                                               None)


@pytest.mark.parametrize(("reply", "message"), [
    ('{"next_speaker": "oracle", "instruction": "Predict."}', "'oracle', which is not one of ['anchor', "),
    ('{"next_speaker": "anchor"}', '"instruction": Field required'),
    ("I think the Anchor should speak.", "no JSON object with the keys"),
    (json.dumps({"next_speaker": "anchor", "instruction": "x" * 301}), '"instruction": String should have at most'),
    ('{"next_speaker": "anchor", "instruction": "Listen.", "volume": 11}', '"volume": Extra inputs'),
])
def test_an_invalid_directive_says_what_is_wrong(reply, message):
    with pytest.raises(ReplyError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_directive(reply, ROSTER)


def test_a_disabled_persona_is_not_a_valid_speaker():
    roster = ROSTER.model_copy(update={"personas": [p.model_copy(update={"enabled": p.enabled and p.id != "beacon"})
                                                    for p in ROSTER.personas]})
    with pytest.raises(ReplyError, match="not one of \\['anchor', 'catalyst'\\]"):
        parse_directive('{"next_speaker": "beacon", "instruction": "Encourage."}', roster)


def test_the_prompt_shows_the_roster_and_who_spoke_when():
    prompt = director_messages(ROSTER, TURNS)[0]["content"]
    assert all(persona.id in prompt for persona in ROSTER.personas)
    assert "[2] anchor: That sounds really heavy." in prompt and "[4] catalyst:" in prompt
    without_beacon = ROSTER.model_copy(update={"personas": [p.model_copy(update={"enabled": p.id != "beacon"})
                                                            for p in ROSTER.personas]})
    assert "beacon" not in director_messages(without_beacon, TURNS)[0]["content"].lower(), "a disabled one is not offered"


def test_the_fallback_is_a_seeded_random_persona_neutral_between_them():
    """The same conversation and seed give the same persona; over conversations each persona is drawn about as
    often as the others, and the draw does not follow who spoke least recently (it would always be the Beacon)."""
    assert fallback_speaker(ROSTER, TURNS, 3) == fallback_speaker(ROSTER, list(TURNS), 3)
    drawn = [fallback_speaker(ROSTER, [*TURNS, Turn("user", f"And another thing, number {i}.")], seed)
             for i in range(200) for seed in (None, 7)]
    shares = {pid: drawn.count(pid) / len(drawn) for pid in ("anchor", "catalyst", "beacon")}
    assert set(drawn) == set(shares) and all(0.25 < share < 0.42 for share in shares.values()), shares
    assert len({fallback_speaker(ROSTER, TURNS, seed) for seed in range(20)}) == 3  # the seed changes the draw
    without_beacon = ROSTER.model_copy(update={"personas": [p.model_copy(update={"enabled": p.id != "beacon"})
                                                            for p in ROSTER.personas]})
    assert {fallback_speaker(without_beacon, TURNS, seed) for seed in range(50)} == {"anchor", "catalyst"}


def test_an_invalid_reply_is_retried_with_a_repair_turn():
    model = ScriptedDirector(['{"next_speaker": "oracle", "instruction": "Predict."}',
                              '{"next_speaker": "beacon", "instruction": "Point to a next step.", "tone": "warm"}'])
    reply = asyncio.run(direct(model, ROSTER, TURNS, seed=11))
    assert not reply.fallback and reply.attempts == 2 and reply.directive.next_speaker == "beacon"
    first, second = model.requests
    assert (first["seed"], second["seed"]) == (11, 12)
    assert first["format"]["json_schema"]["schema"]["properties"]["next_speaker"]["enum"] == [
        "anchor", "catalyst", "beacon"]
    assert "'oracle', which is not one of" in second["messages"][-1]["content"]


def test_a_director_that_never_gives_a_valid_directive_falls_back_and_says_so():
    # A real OpenAI-compatible server without structured output, whose replies are words: every attempt is invalid.
    with serve(make_app(seconds_per_token=0.0, structured_output=False)) as url:
        backend = OpenAIBackend("sim-chat", base_url=f"{url}/v1", max_retries=0)
        reply = asyncio.run(direct(backend, ROSTER, TURNS, seed=3, max_attempts=2))
        answered = httpx.get(f"{url}/stats").json()["answered"]
    assert reply.fallback and reply.attempts == 2 and "no JSON object" in reply.error
    assert reply.directive.next_speaker == fallback_speaker(ROSTER, TURNS, 3), "the seeded random persona"
    assert answered == 2

