"""The Director's directive: who speaks next and what to ask of them, parsed and validated.

The Director is an LLM role. Its reply is asked for as structured output (a JSON schema whose
`next_speaker` is an enum of the active roster) where the backend has it, and parsed and validated
here whatever the backend claims. An invalid reply (malformed, or a speaker not in the roster) is
retried with a repair turn. After `max_attempts` the fallback applies: an enabled persona drawn at random,
seeded by the request's seed and the conversation so far, with a generic instruction. It is neutral on
purpose: a rule such as "the least recent speaker" always alternates, which a group judge may prefer to
anything the Director writes, so the fallback would compete with the directives it stands in for.
Every fallback is flagged on its result, so episodes count and report them; none is silent.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

from pydantic import ValidationError

from mascot.config import SamplingParams
from mascot.dialogue.turns import MAX_INSTRUCTION_CHARS, Directive, Turn, opening_query
from mascot.llm import LLMBackend
from mascot.llm.structured import ReplyError, extract_json_object
from mascot.prompts import render
from mascot.roster import Persona, Roster

FALLBACK_INSTRUCTION = "Continue the conversation in your role, building on what was said last."
# Where a directive makes its choice: its `next_speaker` key and value, the part that
# `train.director.credit: choice` trains (mascot.train.choice_credit).
CHOICE = re.compile(r'"next_speaker"\s*:\s*"[^"]*"')


@dataclass(frozen=True)
class DirectorReply:
    directive: Directive
    seed: int | None  # of the first request (attempt k was seeded seed + k); None for a given sample
    attempts: int
    fallback: bool  # the Director gave no valid directive; `error` says why
    error: str | None = None


def active_personas(roster: Roster) -> list[Persona]:
    return [persona for persona in roster.personas if persona.enabled]


def director_messages(roster: Roster, turns: list[Turn]) -> list[dict[str, str]]:
    """The Director's prompt: the roster, the query the opening turns carry (if any), then the
    conversation so far with who spoke at each turn."""
    content = render("director.j2", personas=active_personas(roster), turns=turns, query=opening_query(turns))
    return [{"role": "user", "content": content}]


def directive_response_format(roster: Roster) -> dict:
    """An OpenAI-style strict JSON schema for a directive of this roster."""
    schema = {
        "type": "object",
        "properties": {
            "next_speaker": {"type": "string", "enum": [persona.id for persona in active_personas(roster)]},
            "instruction": {"type": "string", "maxLength": MAX_INSTRUCTION_CHARS},
            "tone": {"type": ["string", "null"]},
        },
        "required": ["next_speaker", "instruction", "tone"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": "directive", "strict": True, "schema": schema}}


def parse_directive(text: str, roster: Roster) -> Directive:
    """The directive in a reply, or ReplyError saying what is wrong with it (for the repair turn)."""
    data = extract_json_object(text, {"next_speaker", "instruction"})
    try:
        directive = Directive.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f'"{".".join(map(str, e["loc"])) or "reply"}": {e["msg"]}' for e in exc.errors())
        raise ReplyError(f"invalid directive: {problems}") from None
    speakers = [persona.id for persona in active_personas(roster)]
    if directive.next_speaker not in speakers:
        raise ReplyError(f'"next_speaker" is {directive.next_speaker!r}, which is not one of {speakers}')
    return directive


def fallback_speaker(roster: Roster, turns: list[Turn], seed: int | None) -> str:
    """An enabled persona drawn at random, the same for the same roster, conversation and seed (a string seeds
    `random.Random` through SHA-512, so the draw does not depend on the process)."""
    key = "\x1f".join(["fallback", str(seed), *(f"{turn.speaker}\x1e{turn.text}" for turn in turns)])
    return random.Random(key).choice([persona.id for persona in active_personas(roster)])


async def direct(backend: LLMBackend, roster: Roster, turns: list[Turn], seed: int, *, max_attempts: int = 3,
                 params: SamplingParams | None = None) -> DirectorReply:
    """Ask the Director for the next directive; retry invalid replies, then fall back (flagged)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    messages = director_messages(roster, turns)
    params = params or SamplingParams(temperature=0.7, max_new_tokens=128)
    response_format, error = directive_response_format(roster), "no attempt was made"
    for attempt in range(max_attempts):
        # A retry carries the invalid reply and what is wrong with it: another request, another cache key.
        reply = (await backend.generate(messages, n=1, params=params, seed=seed + attempt,
                                        response_format=response_format))[0]
        try:
            return DirectorReply(parse_directive(reply, roster), seed, attempts=attempt + 1, fallback=False)
        except ReplyError as exc:
            error = str(exc)
            repair = render("director_repair.j2", error=error, speakers=[p.id for p in active_personas(roster)])
            messages = [*messages, {"role": "assistant", "content": reply.strip() or "(empty reply)"},
                        {"role": "user", "content": repair}]
    return fallback_reply(roster, turns, seed, max_attempts, error)


def fallback_reply(roster: Roster, turns: list[Turn], seed: int | None, attempts: int, error: str) -> DirectorReply:
    """The documented fallback, flagged: a seeded random persona, with a generic instruction."""
    directive = Directive(next_speaker=fallback_speaker(roster, turns, seed), instruction=FALLBACK_INSTRUCTION)
    return DirectorReply(directive, seed, attempts=attempts, fallback=True, error=error)


def read_reply(text: str, roster: Roster, turns: list[Turn], fallback_seed: int | None) -> DirectorReply:
    """One sampled reply as written, without a retry: its directive, or the flagged fallback drawn with
    `fallback_seed`. GRPO and the before/after comparison score a policy's samples this way; a given sample has
    no request seed."""
    try:
        return DirectorReply(parse_directive(text, roster), None, attempts=1, fallback=False)
    except ReplyError as exc:
        return replace(fallback_reply(roster, turns, fallback_seed, 1, str(exc)), seed=None)
