"""What every judge takes and returns: a `JudgeItem` in, a `Judgment` out.

A judgment either succeeded (one score per rubric criterion, `overall` = their mean) or failed
(no scores, `overall` None, an error message). A failure is never a score of 0: a 0 would read as
"the worst reply" to the preference-pair builder, when it only means "the judge could not say".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mascot.data.context import Context
from mascot.roster import Persona


@dataclass(frozen=True)
class JudgeItem:
    """One candidate reply of one (context, persona) query, as a judge sees it."""

    query_id: str
    candidate_idx: int
    context: Context
    persona: Persona
    candidate: str


class Judgment(BaseModel):
    """One judge's verdict on one candidate. Build it with `succeeded` or `failed`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query_id: str
    candidate_idx: int = Field(ge=0)
    judge: str = Field(min_length=1, description="The judge's name (a column value in judgments.parquet).")
    scores: dict[str, float] = Field(description="Criterion id -> score; empty when the judgment failed.")
    overall: float | None = Field(description="Mean of `scores`; None when the judgment failed, never 0.")
    feedback: str = Field(description="The judge's written feedback; empty on failure.")
    ok: bool
    error: str | None = Field(description="Why the judgment failed; None when it succeeded.")
    attempts: int = Field(ge=1, description="Requests spent on this judgment (1 for offline judges).")

    @model_validator(mode="after")
    def _success_or_failure(self) -> Judgment:
        if self.ok:
            if not self.scores or self.overall is None or self.error is not None:
                raise ValueError("a successful judgment needs scores and an overall score, and no error")
            if abs(self.overall - fmean(self.scores.values())) > 1e-9:
                raise ValueError(f"overall {self.overall} is not the mean of the scores {self.scores}")
        elif self.scores or self.overall is not None or not self.error:
            raise ValueError("a failed judgment has no scores, overall None and an error message")
        return self

    @classmethod
    def succeeded(
        cls, item: JudgeItem, judge: str, scores: dict[str, float], feedback: str, attempts: int = 1
    ) -> Judgment:
        scores = {key: float(value) for key, value in scores.items()}
        return cls(
            query_id=item.query_id, candidate_idx=item.candidate_idx, judge=judge, scores=scores,
            overall=fmean(scores.values()), feedback=feedback, ok=True, error=None, attempts=attempts,
        )

    @classmethod
    def failed(cls, item: JudgeItem, judge: str, error: str, attempts: int) -> Judgment:
        return cls(
            query_id=item.query_id, candidate_idx=item.candidate_idx, judge=judge, scores={},
            overall=None, feedback="", ok=False, error=error, attempts=attempts,
        )


@runtime_checkable
class Judge(Protocol):
    """Anything that scores a candidate against a rubric. `name` labels its rows in artifacts."""

    name: str

    async def judge(self, item: JudgeItem, seed: int) -> Judgment: ...


def judge_items(candidates: Iterable) -> list[JudgeItem]:
    """Flatten `mascot.stage1.candidates.Candidates` (a query plus its K texts) into judge items."""
    return [
        JudgeItem(
            query_id=group.query.id, candidate_idx=index, context=group.query.context,
            persona=group.query.persona, candidate=text,
        )
        for group in candidates
        for index, text in enumerate(group.texts)
    ]
