"""What a conversation is made of: turns, and the directives that lead to the companions' turns.

A turn is who spoke (a persona id, "user", or a label from the corpus for the opening), what they
said, and how it came about: the request seed of its text and, for a companion, the Director's
directive with its seed, attempts and whether it is the flagged fallback. Episodes store exactly
these fields (`mascot.dialogue.episodes.turn_rows`), so every turn can be asked again.

The opening turns of a context that is about a query (a QMSum window, `mascot.data.qmsum.meeting_query`)
also carry that query. A Director's prompt is built from the roster and the turns alone, in episodes
and in Stage 2's training and evaluation alike, so the query travels with the turns it belongs to and
every one of those prompts shows it. Opening turns are rebuilt from their context, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mascot.data.context import Context
from mascot.data.qmsum import meeting_query

MAX_INSTRUCTION_CHARS = 300
Role = Literal["context", "companion", "user"]
USER = "user"


class Directive(BaseModel):
    """The Director's decision for one turn: who speaks next, and what to ask of them."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)

    next_speaker: str = Field(min_length=1, description="A persona id of the active roster.")
    instruction: str = Field(min_length=1, max_length=MAX_INSTRUCTION_CHARS, description="What to do next.")
    tone: str | None = Field(default=None, max_length=80, description="How to sound, if it matters.")


@dataclass(frozen=True)
class Turn:
    speaker: str  # a persona id, USER, or the corpus's label for an opening turn
    text: str
    role: Role = "companion"
    seed: int | None = None  # the request seed of `text`; None for the corpus's opening turns
    directive: Directive | None = None  # companion turns: the directive it answered
    director_seed: int | None = None
    directive_attempts: int = 0
    fallback: bool = False  # the Director gave no valid directive, so the fallback was used
    # Opening turns only: the context's meeting query. Rebuilt from the context, never stored.
    meeting_query: str | None = None


def opening_query(turns: list[Turn]) -> str | None:
    """The meeting query the conversation is about: the one its opening turns carry, if any."""
    return next((turn.meeting_query for turn in turns if turn.meeting_query), None)


def opening_turns(context: Context) -> list[Turn]:
    """The context's messages as the turns that open an episode, each carrying the context's meeting query."""
    default = {"user": USER, "assistant": "listener", "system": "system"}
    # Meeting transcripts name their speakers; emotional-support ids ('3', '14') mean nothing.
    named = context.domain == "meetings"
    query = meeting_query(context)
    return [Turn(m.name if named and m.name else default[m.role], m.content, role="context", meeting_query=query)
            for m in context.history]
