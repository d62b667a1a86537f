"""The one shape every corpus loader produces: a conversation prefix a companion answers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant"]
Domain = Literal["emotional_support", "meetings"]
Split = Literal["train", "validation", "test"]


class Message(BaseModel):
    """One chat message. `name` keeps the original speaker label where the corpus has one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    content: str = Field(min_length=1)
    name: str | None = None


class Context(BaseModel):
    """A dialogue prefix, ready to be answered by a persona or a companion group."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Stable id: the same record always gets the same id.")
    domain: Domain
    source: str = Field(description="Corpus name, e.g. empathetic_dialogues, qmsum, esconv.")
    split: Split
    valence: Literal["positive", "negative", "neutral"] | None = Field(
        default=None, description="Emotional valence bucket (emotional support corpora)."
    )
    meeting_type: Literal["Academic", "Product", "Committee"] | None = Field(
        default=None, description="QMSum domain (meetings corpora)."
    )
    history: list[Message] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class CorpusFormatError(ValueError):
    """A corpus file does not match its release format. The message names file, record and field."""

    def __init__(self, path: object, record: object, field: str | None, problem: str):
        self.path, self.record, self.field, self.problem = str(path), record, field, problem
        where = f"{path}: record {record}"
        if field:
            where += f", field '{field}'"
        super().__init__(f"{where}: {problem}")
