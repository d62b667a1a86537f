"""Rubrics: the criteria a judge scores, each with anchored descriptions of every score.

Rubrics live in YAML (`configs/rubrics/<domain>.yaml`), not in code. The overall score of a
judgment is the mean of its criterion scores. Like rosters, they are configuration read by every
stage (the persona rubric now, the collective rubric of Stage 2 next), so this module sits at the
bottom of the package, beside `roster.py`, and judges import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from mascot.yamlio import FieldError, load_validated, require_unique_ids

Slug = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$", max_length=48)]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class Criterion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    id: Slug = Field(description="Column name in judgments.parquet, e.g. 'empathetic_support'.")
    name: Text = Field(description="Display name, e.g. 'Empathetic Support Quality'.")
    description: Text = Field(description="What the criterion measures.")
    anchors: dict[int, Text] = Field(description="What each score on the scale means.")


class Rubric(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    domain: Literal["emotional_support", "meetings"] = Field(description="Domain the rubric judges.")
    name: Text = Field(description="Human-readable rubric name.")
    scale_min: int = Field(default=1, description="Lowest score.")
    scale_max: int = Field(default=5, description="Highest score.")
    criteria: list[Criterion] = Field(min_length=1, description="Criteria, each scored on the scale.")

    @model_validator(mode="after")
    def _complete(self) -> Rubric:
        if self.scale_min >= self.scale_max:
            raise FieldError("scale_max", f"scale_max must be above scale_min ({self.scale_min})")
        require_unique_ids("criteria", [c.id for c in self.criteria], "criterion")
        scale = set(range(self.scale_min, self.scale_max + 1))
        for index, criterion in enumerate(self.criteria):
            if set(criterion.anchors) != scale:
                raise FieldError(("criteria", index, "anchors"),
                                 f"criterion '{criterion.id}' needs one anchor for each score "
                                 f"{self.scale_min}..{self.scale_max}, got {sorted(criterion.anchors)}")
        return self

    @property
    def span(self) -> int:
        """The largest possible gap between two overall scores."""
        return self.scale_max - self.scale_min

    @property
    def criterion_ids(self) -> list[str]:
        return [c.id for c in self.criteria]


def load_rubric(path: str | Path) -> Rubric:
    return load_validated(path, Rubric)
