"""A panel of judges: every judge scores every candidate; scores are tabled, combined and compared.

`judgments_frame` is the stage1/judgments.parquet table (one row per candidate and judge).
`aggregate_scores` turns it into one overall score per candidate for the preference-pair builder,
`agreement` says how far the judges agree, and `check_failure_rate` stops a run whose judges fail
too often to be trusted.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.config import JudgeConfig
from mascot.judges.base import Judge, JudgeItem, Judgment
from mascot.judges.group import GroupHeuristicJudge, group_judge_messages
from mascot.judges.heuristic import HeuristicJudge
from mascot.judges.llm_judge import LLMJudge, judge_messages
from mascot.judges.planted import PlantedGroupJudge
from mascot.llm import RequestCache, make_backend
from mascot.queries import request_seed
from mascot.rubrics import Rubric, load_rubric

Aggregation = Literal["mean", "zscore"]
Level = Literal["reply", "block"]  # what a panel judges: one persona's reply, or a block of the group's turns
KEY = ["query_id", "candidate_idx"]
PLANTED_BLOCKS_ONLY = "a planted judge scores the group's blocks (stage2.judges), not one persona's reply"


class JudgeFailureRateExceeded(RuntimeError):
    """More judgments failed than the run allows (stage1.max_judge_failure_rate)."""

    def __init__(self, message: str, *, failed: int, total: int, rate: float, max_rate: float):
        super().__init__(message)
        self.failed, self.total, self.rate, self.max_rate = failed, total, rate, max_rate


class JudgePanel:
    """Judges that all score the same candidates; `aggregation` says how their scores combine."""

    def __init__(self, judges: Sequence[Judge], aggregation: Aggregation = "mean"):
        if not judges:
            raise ValueError("a judge panel needs at least one judge")
        names = [judge.name for judge in judges]
        if len(set(names)) != len(names):
            raise ValueError(f"judge names must be unique within a panel, got {names}")
        if aggregation not in ("mean", "zscore"):
            raise ValueError(f"aggregation must be 'mean' or 'zscore', got {aggregation!r}")
        self.judges = list(judges)
        self.aggregation = aggregation

    @property
    def names(self) -> list[str]:
        return [judge.name for judge in self.judges]

    async def judge_all(
        self, items: Sequence[JudgeItem], seed: int, on_done: Callable[[Judgment], None] | None = None,
        on_start: Callable[[], None] | None = None,
    ) -> list[Judgment]:
        """Every judge scores every item, all at once (the backends limit concurrency).

        Results are ordered by item, then by judge, whatever order they finish in. Each request's
        seed is derived from the run seed, the judge and the candidate, so reruns hit the cache.
        """

        async def one(item: JudgeItem, judge: Judge) -> Judgment:
            judgment_seed = request_seed(seed, judge.name, item.query_id, str(item.candidate_idx))
            if on_start is not None:
                on_start()
            judgment = await judge.judge(item, judgment_seed)
            if on_done is not None:
                on_done(judgment)
            return judgment

        return list(await asyncio.gather(*(one(item, judge) for item in items for judge in self.judges)))

    def aggregate(self, frame: pl.DataFrame) -> pl.DataFrame:
        return aggregate_scores(frame, self.aggregation, judges=self.names)


class PanelSpec(BaseModel):
    """A judge panel as a value: its judges' configs and the rubric they score against.

    It holds the rubric's content, not its path, so that as a step's input (and cache key) an edit
    to the rubric file re-runs every step that judges. How scores are aggregated is not part of
    it: that decides the pairs, not the judgments.
    """

    model_config = ConfigDict(frozen=True)

    judges: list[JudgeConfig]
    rubric: Rubric
    level: Level = "reply"

    @classmethod
    def load(cls, judges: list[JudgeConfig], rubric: Path, level: Level = "reply") -> PanelSpec:
        return cls(judges=judges, rubric=load_rubric(rubric), level=level)


def make_judge(config: JudgeConfig, rubric: Rubric, *, cache: RequestCache | None = None,
               level: Level = "reply") -> Judge:
    """The judge a config entry describes (its `tiny:` model, if any, already resolved to a folder), for
    one persona's reply (Stage 1) or a block of the group's turns (Stage 2)."""
    if config.kind == "heuristic":
        return HeuristicJudge(rubric, name=config.label) if level == "reply" else \
            GroupHeuristicJudge(rubric, name=config.label)
    if config.kind == "planted":
        if level != "block":
            raise ValueError(PLANTED_BLOCKS_ONLY)
        return PlantedGroupJudge(rubric, config.prefer or {}, name=config.label, control=config.control)
    backend = make_backend(config.backend, cache=cache)
    return LLMJudge(backend, rubric, name=config.label, max_attempts=config.max_attempts,
                    params=config.backend.params, messages=judge_messages if level == "reply" else group_judge_messages)


def judge_rubric_problem(config: JudgeConfig, rubric: Rubric, level: Level) -> str | None:
    """Why the judge a config entry describes cannot score the rubric's criteria, or None. Each kind of
    judge answers for itself; `load_config(..., rubric_problem=judge_rubric_problem)` reports the answer
    at the config line that names the rubric, before anything runs."""
    if config.kind == "llm":
        return LLMJudge.rubric_problem(rubric)
    if config.kind == "planted":
        return None if level == "block" else PLANTED_BLOCKS_ONLY
    return (HeuristicJudge if level == "reply" else GroupHeuristicJudge).rubric_problem(rubric)


def make_panel(spec: PanelSpec, *, cache: RequestCache | None = None, aggregation: Aggregation = "mean") -> JudgePanel:
    return JudgePanel([make_judge(c, spec.rubric, cache=cache, level=spec.level) for c in spec.judges], aggregation)


def frame_schema(rubric: Rubric) -> dict[str, pl.DataType]:
    return {
        "query_id": pl.String, "candidate_idx": pl.Int64, "judge": pl.String,
        **{cid: pl.Float64 for cid in rubric.criterion_ids},
        "overall": pl.Float64, "feedback": pl.String, "ok": pl.Boolean, "error": pl.String, "attempts": pl.Int64,
    }


def judgments_frame(judgments: Sequence[Judgment], rubric: Rubric) -> pl.DataFrame:
    """One row per judgment: criterion columns are null (not 0) where the judgment failed."""
    expected = set(rubric.criterion_ids)
    rows = []
    for j in judgments:
        if j.ok and set(j.scores) != expected:
            raise ValueError(f"judge '{j.judge}' scored criteria {sorted(j.scores)} for {j.query_id}#"
                             f"{j.candidate_idx}, but rubric '{rubric.name}' has {sorted(expected)}")
        rows.append({
            "query_id": j.query_id, "candidate_idx": j.candidate_idx, "judge": j.judge,
            **{cid: j.scores.get(cid) for cid in rubric.criterion_ids},
            "overall": j.overall, "feedback": j.feedback, "ok": j.ok, "error": j.error, "attempts": j.attempts,
        })
    return pl.DataFrame(rows, schema=frame_schema(rubric))


def aggregate_scores(
    frame: pl.DataFrame, aggregation: Aggregation, judges: Sequence[str] | None = None
) -> pl.DataFrame:
    """One overall score per candidate: [query_id, candidate_idx, overall, n_judges].

    A candidate is scored only when every judge of the panel (`judges`, default: all judges in
    the frame) scored it ok. Averaging a partial panel would mix judges' different uses of the
    scale, so a candidate with a failed judge is left out, never scored 0.
    `mean`: mean of the judges' overall scores. `zscore`: each judge's overall scores are z-scored
    (population sd; a judge with sd 0 gives 0) over the candidates every judge scored, so that
    all judges are standardised on the same set, then averaged across judges.
    """
    panel = sorted(set(judges) if judges is not None else set(frame["judge"].unique().to_list()))
    schema = {"query_id": pl.String, "candidate_idx": pl.Int64, "overall": pl.Float64, "n_judges": pl.Int64}
    ok = frame.filter(pl.col("ok") & pl.col("judge").is_in(panel) & pl.col("overall").is_not_null())
    complete = ok.group_by(KEY).agg(pl.col("judge").n_unique().alias("n_judges")).filter(
        pl.col("n_judges") == len(panel))
    scored = ok.join(complete.select(KEY), on=KEY, how="semi")
    if aggregation == "zscore":
        mean, sd = pl.col("overall").mean().over("judge"), pl.col("overall").std(ddof=0).over("judge")
        scored = scored.with_columns(
            pl.when(sd > 0).then((pl.col("overall") - mean) / sd).otherwise(0.0).alias("overall"))
    elif aggregation != "mean":
        raise ValueError(f"aggregation must be 'mean' or 'zscore', got {aggregation!r}")
    result = scored.group_by(KEY).agg(pl.col("overall").mean(), pl.len().cast(pl.Int64).alias("n_judges"))
    return result.sort(KEY).select(list(schema)).cast(schema)


def agreement(frame: pl.DataFrame) -> dict[str, Any]:
    """Inter-judge agreement on overall scores: Krippendorff's alpha (interval) and Spearman.

    Units are candidates, coders are judges; a failed judgment is a missing value. The mean
    pairwise Spearman correlation uses, for each pair of judges, the candidates both scored ok.
    Values are None where they cannot be computed (one judge, too few candidates, no variation).
    """
    judges = sorted(frame["judge"].unique().to_list())
    result: dict[str, Any] = {"n_judges": len(judges), "n_candidates": frame.select(KEY).unique().height,
                              "krippendorff_alpha": None, "mean_spearman": None, "pairwise_spearman": {},
                              "note": None}
    if len(judges) < 2:
        result["note"] = "agreement needs at least two judges; this panel has " + str(len(judges))
        return result
    import numpy as np
    from scipy.stats import spearmanr

    ok = frame.filter(pl.col("ok"))
    wide = frame.select(KEY).unique()
    if ok.height:
        wide = wide.join(ok.pivot(on="judge", index=KEY, values="overall"), on=KEY, how="left")
    wide = wide.with_columns([pl.lit(None, pl.Float64).alias(j) for j in judges if j not in wide.columns])
    matrix = wide.select(judges).to_numpy().astype(float).T  # coders x units, NaN = missing
    notes = []
    try:
        import krippendorff

        alpha = float(krippendorff.alpha(reliability_data=matrix, level_of_measurement="interval"))
        result["krippendorff_alpha"] = alpha if math.isfinite(alpha) else None
    except ValueError as exc:  # e.g. every score is the same value: alpha is undefined
        notes.append(f"Krippendorff's alpha undefined: {exc}")
    for a, b in combinations(range(len(judges)), 2):
        both = ~np.isnan(matrix[a]) & ~np.isnan(matrix[b])
        rho = None
        if both.sum() >= 2 and np.ptp(matrix[a][both]) > 0 and np.ptp(matrix[b][both]) > 0:
            rho = float(spearmanr(matrix[a][both], matrix[b][both]).statistic)
        result["pairwise_spearman"][f"{judges[a]}|{judges[b]}"] = rho
    rhos = [r for r in result["pairwise_spearman"].values() if r is not None]
    result["mean_spearman"] = sum(rhos) / len(rhos) if rhos else None
    if not rhos:
        notes.append("no judge pair has two or more commonly scored candidates with varying scores")
    result["note"] = "; ".join(notes) or None
    return result


def failure_rate(frame: pl.DataFrame) -> float:
    """Share of judgments that failed (0.0 for an empty frame)."""
    return 0.0 if frame.height == 0 else frame.filter(~pl.col("ok")).height / frame.height


def check_failure_rate(frame: pl.DataFrame, max_rate: float) -> float:
    """Return the failure rate, or raise JudgeFailureRateExceeded when it is above `max_rate`."""
    rate = failure_rate(frame)
    if rate <= max_rate:
        return rate
    failed = frame.filter(~pl.col("ok"))
    by_judge = (frame.group_by("judge").agg((~pl.col("ok")).sum().alias("failed"), pl.len().alias("total"))
                .sort("judge"))
    per_judge = ", ".join(f"{r['judge']} {r['failed']}/{r['total']}" for r in by_judge.iter_rows(named=True))
    sample = failed.sort(["judge", *KEY]).row(0, named=True)
    message = (
        f"{failed.height} of {frame.height} judgments failed ({rate:.1%}), above the allowed "
        f"{max_rate:.1%} (stage1.max_judge_failure_rate). Failed per judge: {per_judge}. "
        f"Sample error from judge '{sample['judge']}' on {sample['query_id']}#{sample['candidate_idx']} "
        f"after {sample['attempts']} attempts: {sample['error']}"
    )
    raise JudgeFailureRateExceeded(message, failed=failed.height, total=frame.height, rate=rate, max_rate=max_rate)
