"""Personas, rosters and simulated-user profiles.

Rosters (`configs/rosters/*.yaml`) are the only place personas are defined. Every other part of
the project refers to a persona by its `id`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from mascot.yamlio import FieldError, load_validated, require_unique_ids

Slug = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$", max_length=48)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Persona(Strict):
    """One companion persona. The Speaker policy is conditioned on it through the prompt."""

    id: Slug = Field(description="Stable identifier used in artifacts, e.g. 'anchor'.")
    name: Text = Field(description="Display name, e.g. 'The Anchor'.")
    role: Text = Field(description="One-line role in the group, e.g. 'emotional validator'.")
    description: Text = Field(description="Who the persona is and how it helps.")
    style_rules: list[Text] = Field(min_length=1, description="How the persona speaks.")
    must_not: list[Text] = Field(min_length=1, description="What the persona never does.")
    asks_questions: bool = Field(
        default=False, description="Whether questions are part of this persona's style (used by judges)."
    )
    lexicon: list[Text] = Field(
        default_factory=list, description="Words typical of the persona (used by the heuristic judge)."
    )
    enabled: bool = Field(default=True, description="Disabled personas stay in the file but take no turns.")


class Roster(Strict):
    """A fixed set of personas for one domain."""

    domain: Literal["emotional_support", "meetings"] = Field(description="Domain the roster serves.")
    name: Text = Field(description="Human-readable name of the companion group.")
    personas: list[Persona] = Field(min_length=1, description="All personas, enabled or not.")

    @model_validator(mode="after")
    def _ids_unique_and_some_enabled(self) -> Roster:
        require_unique_ids("personas", [p.id for p in self.personas], "persona")
        if not any(p.enabled for p in self.personas):
            raise FieldError("personas", "at least one persona must be enabled")
        return self

    @property
    def active(self) -> list[Persona]:
        return [p for p in self.personas if p.enabled]

    def get(self, persona_id: str) -> Persona:
        for persona in self.personas:
            if persona.id == persona_id:
                return persona
        raise KeyError(f"no persona '{persona_id}' in roster '{self.name}'; known: {[p.id for p in self.personas]}")


Trait = Annotated[float, Field(ge=0.0, le=1.0)]


class BigFive(Strict):
    """Big Five traits on a 0-1 scale (0 = low, 1 = high)."""

    openness: Trait
    conscientiousness: Trait
    extraversion: Trait
    agreeableness: Trait
    neuroticism: Trait


class UserProfile(Strict):
    """A simulated user who takes turns in Stage 2 episodes."""

    id: Slug
    name: Text
    description: Text = Field(description="Background and current situation, in the user's voice.")
    big_five: BigFive | None = Field(default=None, description="Optional personality profile.")
    domains: list[Literal["emotional_support", "meetings"]] = Field(
        min_length=1, description="Domains this user can take part in."
    )


class UserProfiles(Strict):
    profiles: list[UserProfile] = Field(min_length=1)

    @model_validator(mode="after")
    def _ids_unique(self) -> UserProfiles:
        require_unique_ids("profiles", [p.id for p in self.profiles], "profile")
        return self



def load_roster(path: str | Path) -> Roster:
    return load_validated(path, Roster)


def load_user_profiles(path: str | Path) -> UserProfiles:
    return load_validated(path, UserProfiles)
