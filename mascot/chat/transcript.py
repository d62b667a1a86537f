"""A conversation with the group, as it happened: what the person said, who answered and why, and what the guard did.

A transcript is JSON (`/save`, the web page's download) that `mascot chat --replay` reads back, and a
Markdown rendering of it for case studies. Each entry is one of:

- `user`: the person's message (after `clean_message`);
- `reply`: a companion's turn, with the Director's directive it answered (speaker, instruction, tone,
  attempts, and whether it was the fallback), how many drafts the guard discarded, and whether the
  turn was withheld;
- `crisis`: the guard's answer to a message that suggested a crisis, with the rules that matched, their
  categories, and the moderation layer's verdict where one ran (no persona answered it);
- `reset`: the person started a new conversation.

The roster is stored with the transcript, so a replay shows the names and colours of the group that
spoke, whatever the roster file says now; `load_transcript` refuses a file whose replies are by a speaker
outside that roster, naming the entry and the field.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mascot.artifacts import write_text
from mascot.chat.moderation import ModerationVerdict
from mascot.roster import Roster

FORMAT = "mascot-chat-transcript"
VERSION = 1
# One colour per persona, by roster order, in both surfaces; readable on a light and a dark background.
PALETTE = ("#2a9d8f", "#e76f51", "#8e6cc4", "#d4a017", "#3d85c6", "#c2185b", "#5b8c3a", "#8d6e63")
GUARD = "guard"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at: str = Field(default_factory=now, description="When, in UTC (ISO 8601).")


class UserEntry(Entry):
    type: Literal["user"] = "user"
    text: str


class DirectiveView(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    speaker: str
    instruction: str
    tone: str | None = None
    fallback: bool = Field(description="The Director gave no valid directive, so the documented fallback chose.")
    attempts: int = Field(ge=0, description="Director requests made for this turn.")


class ReplyEntry(Entry):
    type: Literal["reply"] = "reply"
    speaker: str
    name: str
    text: str
    directive: DirectiveView
    discarded: int = Field(default=0, ge=0, description="Drafts the guard discarded for breaking a reply rule "
                           "(a claim to be a person or a professional, means of self-harm).")
    withheld: bool = Field(default=False, description="Every draft broke one; `text` is the guard's note.")


class CrisisEntry(Entry):
    type: Literal["crisis"] = "crisis"
    text: str
    rules: list[str] = Field(default_factory=list, description="The crisis rules the message matched.")
    categories: list[str] = Field(default_factory=list, description="Their categories, each as 'name: title' "
                                  "(e.g. 'plan: C-SSRS 5: a plan (means, place or time)').")
    classifier_score: float | None = None
    moderation: ModerationVerdict | None = Field(default=None, description="The moderation layer's verdict, where "
                                                 "one is configured.")

    def reasons(self) -> list[tuple[str, str]]:
        """Why the guard answered, as (what, why) rows for /why and the page: the categories and rules that
        matched, then the classifier's score and the moderation layer's verdict where they ran."""
        rows = [("category", category) for category in self.categories]
        rows += [("rules", ", ".join(self.rules))] if self.rules else []
        if self.classifier_score is not None:
            rows.append(("classifier", f"score {self.classifier_score:.2f}"))
        if (verdict := self.moderation) is not None:
            said = f"failed, so flagged ({verdict.error})" if verdict.error else \
                f"{'flagged' if verdict.flagged else 'not flagged'}: {', '.join(verdict.categories) or 'safe'}"
            rows.append((verdict.kind, said))
        return rows


class ResetEntry(Entry):
    type: Literal["reset"] = "reset"


TranscriptEntry = Annotated[UserEntry | ReplyEntry | CrisisEntry | ResetEntry, Field(discriminator="type")]


class PersonaView(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    role: str
    color: str = Field(pattern=r"^#[0-9a-fA-F]{6}$", description="#rrggbb; a replay styles the persona's name with it.")


def persona_views(roster: Roster) -> list[PersonaView]:
    """The roster as both surfaces show it: every persona with its colour (by its place in the roster file, so a
    persona keeps its colour whichever subset takes part); only those taking part."""
    return [PersonaView(id=p.id, name=p.name, role=p.role, color=PALETTE[index % len(PALETTE)])
            for index, p in enumerate(roster.personas) if p.enabled]


class Transcript(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["mascot-chat-transcript"] = FORMAT
    version: Literal[1] = VERSION
    run: str = Field(description="The run directory the group was trained in.")
    group: str = Field(description="The roster's name.")
    domain: str
    personas: list[PersonaView]
    seed: int = Field(description="The seed of the conversation's requests.")
    started_at: str = Field(default_factory=now)
    notice: str = Field(description="The notice shown before the conversation.")
    entries: list[TranscriptEntry] = Field(default_factory=list)

    def name_of(self, speaker: str) -> str:
        return next((p.name for p in self.personas if p.id == speaker), speaker)

    def save(self, path: Path) -> tuple[Path, Path]:
        """Write PATH as JSON and its Markdown beside it (PATH with .md); a `.md` PATH names the Markdown."""
        path = Path(path)
        json_path, markdown_path = path.with_suffix(".json"), path.with_suffix(".md")
        write_text(self.model_dump_json(indent=2) + "\n", json_path)
        write_text(self.markdown(), markdown_path)
        return json_path, markdown_path

    def markdown(self) -> str:
        companions = ", ".join(f"{p.name} ({p.role})" for p in self.personas)
        lines = [f"# {self.group}: a conversation", "",
                 f"Run `{self.run}`, started {self.started_at}, seed {self.seed}. Companions: {companions}.", "",
                 f"> {self.notice}", ""]
        for entry in self.entries:
            if isinstance(entry, UserEntry):
                lines += [f"**You:** {entry.text}", ""]
            elif isinstance(entry, ReplyEntry):
                directive = entry.directive
                why = "fallback, the Director gave no valid directive" if directive.fallback else \
                    f"directed: {directive.instruction}" + (f" (tone: {directive.tone})" if directive.tone else "")
                notes = [f"{entry.discarded} draft(s) discarded by the guard"] if entry.discarded else []
                lines += [f"**{entry.name}:** {entry.text}", "",
                          f"<sub>{'; '.join([why, *notes])}</sub>", ""]
            elif isinstance(entry, CrisisEntry):
                why = "; ".join(f"{what}: {value}" for what, value in entry.reasons())
                lines += ["**Safety guard:** " + entry.text.replace("\n", "  \n"), "", f"<sub>{why}</sub>", ""]
            else:
                lines += ["---", "", "*A new conversation.*", ""]
        return "\n".join(lines)


class TranscriptError(ValueError):
    """A transcript file that cannot be replayed; the message names the file and every problem."""


def load_transcript(path: Path) -> Transcript:
    path = Path(path)
    if not path.is_file():
        raise TranscriptError(f"{path}: no such transcript; /save in `mascot chat` writes one (PATH.json and PATH.md)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TranscriptError(f"{path}: not a JSON transcript ({exc}); replay the .json file /save wrote, not the .md")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TranscriptError(f"{path}: not a mascot chat transcript (its 'format' is not {FORMAT!r})")
    try:
        transcript = Transcript.model_validate(data)
    except ValidationError as exc:
        problems = [f"{path}: {'.'.join(map(str, e['loc'])) or 'transcript'}: {e['msg']}" for e in exc.errors()]
        raise TranscriptError("\n".join(problems)) from None
    problems = [f"{path}: {problem}" for problem in roster_problems(transcript)]
    if problems:
        raise TranscriptError("\n".join(problems))
    return transcript


def roster_problems(transcript: Transcript) -> list[str]:
    """Replies by a speaker outside the transcript's own roster (`personas`), each as `entries.N.field: message`:
    the file is not a conversation this group had, so it is refused rather than shown under a made-up name."""
    ids = [p.id for p in transcript.personas]
    problems = [f"personas.{i}.id: {persona_id!r} appears more than once" for i, persona_id in enumerate(ids)
                if persona_id in ids[:i]]
    for index, entry in enumerate(transcript.entries):
        if not isinstance(entry, ReplyEntry):
            continue
        for field, speaker in (("speaker", entry.speaker), ("directive.speaker", entry.directive.speaker)):
            if speaker not in ids:
                problems.append(f"entries.{index}.{field}: {speaker!r} is not a persona of this transcript; "
                                f"expected one of its personas: {', '.join(ids) or '(none listed)'}")
    return problems
