"""A live conversation with a trained group: the person speaks, then the Director picks who answers, turn by turn.

Each message of the person goes through the guard first (`mascot.chat.safety`). A message that suggests a
crisis is answered by the guard's crisis reply and resources, and nothing of it reaches the Director or a
persona, then or later: it is kept in the transcript, not in the conversation the models read. Otherwise
`turns` companion turns follow, each as in the episodes (`mascot.dialogue`): the Director's directive
(retried, then the flagged fallback), then the named persona's reply, conditioned on its persona and the
directive, streamed as it is generated.

A reply that breaks a reply rule (a claim to be a person or a professional, method or means of self-harm) is
never shown: every delta is checked, the stream shows nothing from where a broken rule may still be forming
(`shown_length`), and a draft that breaks one is discarded and the turn sampled again (another seed), up to
`reply_attempts`; then the turn is withheld with a note.

What the person types is only ever the text of a user turn: the roster, the system prompts and the
Director's schema are fixed by the group, the Director reads each turn on one line (as its prompt says: each
line, who spoke), and control tokens are removed. Requests are seeded by the session's seed, the conversation and the turn's position, so a
conversation with a fixed seed (`--seed`) plays the same way again. They do not go through the request
cache: a person's conversation is theirs, and is written only where they save it.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from mascot.chat.moderation import Moderation
from mascot.chat.safety import (
    CrisisClassifier,
    SafetyRules,
    clean_message,
    one_line,
    reply_breaks,
    screen,
    shown_length,
)
from mascot.chat.transcript import (
    CrisisEntry,
    DirectiveView,
    ReplyEntry,
    ResetEntry,
    Transcript,
    UserEntry,
    persona_views,
)
from mascot.config import SamplingParams
from mascot.data.context import Context, Message
from mascot.dialogue.directives import DirectorReply, direct
from mascot.dialogue.episodes import companion_messages
from mascot.dialogue.turns import USER, Turn, opening_turns
from mascot.llm import LLMBackend
from mascot.llm.streaming import stream_reply
from mascot.queries import request_seed
from mascot.roster import Roster


class ChatLimitError(ValueError):
    """A message the session does not take (empty, too long, past the conversation's length); nothing changed."""


@dataclass(frozen=True)
class CompanionGroup:
    """A trained group, ready to talk: its roster (the personas taking part are the enabled ones), its two
    trained roles, the guard, and the bounds of a conversation."""

    name: str  # the run it was trained in
    roster: Roster
    director: LLMBackend
    speaker: LLMBackend
    director_params: SamplingParams
    speaker_params: SamplingParams
    rules: SafetyRules
    classifier: CrisisClassifier | None = None
    moderation: Moderation | None = None
    turns: int = 2
    max_directive_attempts: int = 3
    reply_attempts: int = 3
    max_message_chars: int = 2000
    max_messages: int = 100


class ChatSession:
    """One person's conversation with the group. `send` yields the events of one exchange, as dicts ready for
    JSON: `user`, `crisis`, `directive`, `delta` (a piece of a reply), `discard` (the guard dropped a draft) and
    `reply`. The transcript records what was said, not the deltas."""

    def __init__(self, group: CompanionGroup, seed: int | None = None):
        self.group = group
        self.seed = secrets.randbelow(2**31) if seed is None else seed
        self.transcript = Transcript(run=group.name, group=group.roster.name, domain=group.roster.domain,
                                     personas=persona_views(group.roster), seed=self.seed, notice=group.rules.notice)
        self.conversation = 0
        self.context: Context | None = None
        self.turns: list[Turn] = []
        self.messages = 0

    def reset(self) -> None:
        """Start a new conversation with the same group; the transcript keeps the old one."""
        if self.transcript.entries:
            self.transcript.entries.append(ResetEntry())
        self.conversation += 1
        self.context, self.turns, self.messages = None, [], 0

    def last_answer(self) -> ReplyEntry | CrisisEntry | None:
        """The last companion reply or guard answer: what /why explains."""
        return next((e for e in reversed(self.transcript.entries) if isinstance(e, ReplyEntry | CrisisEntry)), None)

    def check(self, text: str) -> str:
        """The message as the session takes it, or ChatLimitError saying why not."""
        text, group = clean_message(text), self.group
        if not text:
            raise ChatLimitError("the message is empty")
        if len(text) > group.max_message_chars:
            raise ChatLimitError(f"the message has {len(text)} characters; at most {group.max_message_chars} are taken")
        if self.messages >= group.max_messages:
            raise ChatLimitError(f"this conversation has reached its {group.max_messages} messages; reset to start "
                                 "a new one")
        return text

    async def send(self, text: str, turns: int | None = None) -> AsyncIterator[dict]:
        """The person's message, then `turns` companion turns (the group's default when None)."""
        text = self.check(text)
        self.messages += 1
        yield self._record(UserEntry(text=text))
        group = self.group
        screening = await screen(text, group.rules, group.classifier, group.moderation)
        if screening.crisis:
            yield self._record(CrisisEntry(text=group.rules.crisis_text(), rules=screening.rules,
                                           categories=[f"{name}: {group.rules.crisis[name].title}"
                                                       for name in screening.categories],
                                           classifier_score=screening.classifier_score,
                                           moderation=screening.moderation))
            return
        if self.context is None:
            self.context = Context(id=f"chat-{self.seed}-{self.conversation}", domain=self.group.roster.domain,
                                   source="chat", split="test", history=[Message(role="user", content=text)])
            self.turns = opening_turns(self.context)
        else:
            self.turns.append(Turn(USER, text, "user"))
        for _ in range(turns or self.group.turns):
            async for event in self._companion_turn():
                yield event

    async def _companion_turn(self) -> AsyncIterator[dict]:
        group, position = self.group, len(self.turns)
        one_turn_a_line = [replace(turn, text=one_line(turn.text)) for turn in self.turns]  # "each line says who spoke"
        reply = await direct(group.director, group.roster, one_turn_a_line, self._seed(position, "director"),
                             max_attempts=group.max_directive_attempts, params=group.director_params)
        persona = group.roster.get(reply.directive.next_speaker)
        directive = directive_view(reply)
        yield {"type": "directive", "position": position, **directive.model_dump()}
        messages = companion_messages(persona, group.roster, self.context, self.turns, reply.directive)
        seed, discarded = self._seed(position, "speaker"), 0
        for attempt in range(group.reply_attempts):
            text, shown, claims = "", 0, []
            async with contextlib.aclosing(stream_reply(group.speaker, messages, group.speaker_params,
                                                        seed + attempt)) as deltas:
                async for delta in deltas:
                    text += delta
                    if claims := reply_breaks(text, group.rules):
                        break  # closing the stream stops its generation
                    if (visible := shown_length(text, group.rules)) > shown:
                        yield {"type": "delta", "position": position, "speaker": persona.id,
                               "text": text[shown:visible]}
                        shown = visible
            if not claims:
                break
            discarded += 1
            yield {"type": "discard", "position": position, "speaker": persona.id, "claims": claims}
        withheld = bool(claims)
        if withheld:  # every draft made a claim: the models never read this turn
            text, shown = group.rules.withheld_reply, 0
        else:
            self.turns.append(Turn(persona.id, text, "companion", seed + attempt, reply.directive, reply.seed,
                                   reply.attempts, reply.fallback))
        if len(text) > shown:
            yield {"type": "delta", "position": position, "speaker": persona.id, "text": text[shown:]}
        entry = ReplyEntry(speaker=persona.id, name=persona.name, text=text, directive=directive,
                           discarded=discarded, withheld=withheld)
        yield {**self._record(entry), "position": position}

    def _record(self, entry) -> dict:
        self.transcript.entries.append(entry)
        return entry.model_dump()

    def _seed(self, position: int, role: str) -> int:
        return request_seed(self.seed, "chat", str(self.conversation), str(position), role)


def directive_view(reply: DirectorReply) -> DirectiveView:
    directive = reply.directive
    return DirectiveView(speaker=directive.next_speaker, instruction=directive.instruction, tone=directive.tone,
                         fallback=reply.fallback, attempts=reply.attempts)
