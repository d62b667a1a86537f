"""Episodes: the companion group and a simulated user talking, block by block, under a Director.

Each companion turn is three requests' worth of work at most: the Director emits a directive
(`mascot.dialogue.directives.direct`, retried, then the flagged fallback), and the persona it names
replies through the Speaker, conditioned on its persona and on the directive. After a block of N
companion turns the simulated user replies, in character (`user.j2`, with its Big Five profile in
words when it has one).

Every request is seeded from the run seed, the episode, the path through it (`prefix`, a branch,
a rollout) and the turn's position, so a rerun asks exactly the same questions and the request
cache answers them: a killed run resumes without paying for a call twice. Episodes run
concurrently; the backends' limits bound the requests in flight.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mascot.config import SamplingParams
from mascot.data.context import Context
from mascot.data.qmsum import meeting_query
from mascot.dialogue.directives import DirectorReply, direct
from mascot.dialogue.turns import USER, Directive, Turn
from mascot.llm import LLMBackend
from mascot.prompts import render, speaker_messages
from mascot.queries import request_seed
from mascot.roster import BigFive, Persona, Roster, UserProfile


@dataclass(frozen=True)
class Cast:
    """The roles of an episode and how each is asked: the Director, the Speaker and the simulated user."""

    roster: Roster
    director: LLMBackend
    speaker: LLMBackend
    user: LLMBackend
    director_params: SamplingParams
    speaker_params: SamplingParams
    user_params: SamplingParams
    max_directive_attempts: int = 3
    # The Speaker's prompt before the conversation: a persona's own (speaker.j2), or the evaluation's
    # ablation without persona-specific text.
    speaker_prompt: Callable[[Persona, Context, Directive | None], list[dict[str, str]]] = speaker_messages


@dataclass(frozen=True)
class Episode:
    """One conversation to play: its opening context, its simulated user, and the seed of its requests."""

    context: Context
    profile: UserProfile | None
    run_seed: int

    @property
    def id(self) -> str:
        return self.context.id

    def seed(self, path: str, position: int, role: str) -> int:
        return request_seed(self.run_seed, self.id, path, str(position), role)


def choose_profile(profiles: list[UserProfile], context: Context, run_seed: int) -> UserProfile | None:
    """An episode's simulated user: one of the domain's profiles, chosen by seed, or none."""
    fitting = [p for p in profiles if context.domain in p.domains]
    return fitting[request_seed(run_seed, context.id, "user") % len(fitting)] if fitting else None


def companion_messages(persona: Persona, roster: Roster, context: Context, turns: list[Turn],
                       directive: Directive | None, prompt=speaker_messages) -> list[dict[str, str]]:
    """The Speaker's prompt: the persona's speaker prompt and the context (as in Stage 1; `prompt` makes
    them), then the episode so far, with the persona's own turns as its replies and everyone else's labelled."""
    messages = prompt(persona, context, directive)
    for turn in turns:
        if turn.role == "context":
            continue  # already in the context's messages
        if turn.speaker == persona.id:
            messages.append({"role": "assistant", "content": turn.text})
        else:
            label = "" if turn.speaker == USER else f"{roster.get(turn.speaker).name}: "
            messages.append({"role": "user", "content": label + turn.text})
    return alternating(messages)


def alternating(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Consecutive messages of one role joined into one: several people may speak between two turns of
    a persona, and many chat templates refuse (or models misread) two user messages in a row."""
    merged: list[dict[str, str]] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"] != "system":
            merged[-1] = {"role": message["role"], "content": f"{merged[-1]['content']}\n{message['content']}"}
        else:
            merged.append(message)
    return merged


def describe_big_five(traits: BigFive) -> str:
    """'high openness, low extraversion, ...': a profile a model reads more reliably than numbers."""
    def level(value: float) -> str:
        return "high" if value >= 2 / 3 else "low" if value <= 1 / 3 else "moderate"

    return ", ".join(f"{level(value)} {name}" for name, value in traits.model_dump().items())


def user_messages(profile: UserProfile | None, roster: Roster, context: Context,
                  turns: list[Turn]) -> list[dict[str, str]]:
    """The simulated user's prompt: its character (in a meeting, the one who asked the context's
    query), then the conversation from its side."""
    traits = describe_big_five(profile.big_five) if profile and profile.big_five else None
    system = render("user.j2", profile=profile, traits=traits, domain=context.domain, query=meeting_query(context))
    messages = [{"role": "system", "content": system}]
    for turn in turns:
        if turn.speaker == USER:
            messages.append({"role": "assistant", "content": turn.text})
        else:
            label = roster.get(turn.speaker).name if turn.role == "companion" else turn.speaker
            messages.append({"role": "user", "content": f"{label}: {turn.text}"})
    return alternating(messages)


async def companion_turn(cast: Cast, episode: Episode, turns: list[Turn], path: str,
                         reply: DirectorReply | None = None) -> Turn:
    """The Director's directive (or the given one), then the named persona's reply to it."""
    position = len(turns)
    if reply is None:
        reply = await direct(cast.director, cast.roster, turns, episode.seed(path, position, "director"),
                             max_attempts=cast.max_directive_attempts, params=cast.director_params)
    persona = cast.roster.get(reply.directive.next_speaker)
    seed = episode.seed(path, position, "speaker")
    messages = companion_messages(persona, cast.roster, episode.context, turns, reply.directive,
                                  cast.speaker_prompt)
    text = (await cast.speaker.generate(messages, n=1, params=cast.speaker_params, seed=seed))[0]
    return Turn(persona.id, text.strip(), "companion", seed, reply.directive, reply.seed, reply.attempts,
                reply.fallback)


async def user_turn(cast: Cast, episode: Episode, turns: list[Turn], path: str) -> Turn:
    seed = episode.seed(path, len(turns), "user")
    messages = user_messages(episode.profile, cast.roster, episode.context, turns)
    text = (await cast.user.generate(messages, n=1, params=cast.user_params, seed=seed))[0]
    return Turn(USER, text.strip(), "user", seed)


async def play(cast: Cast, episode: Episode, turns: list[Turn], n_turns: int, path: str, *,
               user_after: bool = False, first: DirectorReply | None = None) -> list[Turn]:
    """Play `n_turns` companion turns after `turns` (the first one answering `first`, when given), then
    the user's turn if `user_after`; returns the new turns only."""
    played: list[Turn] = []
    for index in range(n_turns):
        played.append(await companion_turn(cast, episode, [*turns, *played], path, first if index == 0 else None))
    if user_after:
        played.append(await user_turn(cast, episode, [*turns, *played], path))
    return played


def directive_json(directive: Directive | None) -> str | None:
    """The directive as JSON in the schema's key order, the order the Director's prompt asks for."""
    return None if directive is None else json.dumps(directive.model_dump())


def turn_row(turn: Turn) -> dict[str, Any]:
    """A turn as a row of episodes.parquet (the caller adds the episode's columns)."""
    return {"role": turn.role, "speaker": turn.speaker, "text": turn.text, "seed": turn.seed,
            "directive": directive_json(turn.directive), "director_seed": turn.director_seed,
            "directive_attempts": turn.directive_attempts, "fallback": turn.fallback}


def row_turn(row: dict[str, Any]) -> Turn:
    directive = Directive.model_validate_json(row["directive"]) if row["directive"] else None
    return Turn(row["speaker"], row["text"], row["role"], row["seed"], directive, row["director_seed"],
                row["directive_attempts"], row["fallback"])
