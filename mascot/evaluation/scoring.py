"""Scoring the evaluation's conversations: the persona-level rubric on every companion turn, the
collective rubric on every conversation, and the automatic metrics.

The judges are the evaluation's own panels (`eval.judges`, `eval.group_judges`). A persona-level
judge reads each companion turn against the conversation up to it, and against the persona that
spoke (the single assistant's own description, for the baselines). A collective judge reads the
whole conversation after the context. Failures are recorded and counted, never scored.

Judge scores go to a 0–100 scale by the linear map `100 * (score - scale_min) / (scale_max -
scale_min)`: 1 → 0, 3 → 50, 5 → 100 on a 1–5 rubric. A conversation's persona-level score on a
criterion is the mean over its companion turns. `scores.parquet` holds one row per conversation,
metric and judge (`judge` "automatic" for the automatic metrics, whose values are their own).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.artifacts import Artifact, write_parquet
from mascot.data.context import Context, Message
from mascot.data.contexts import read_contexts
from mascot.dialogue.turns import USER, Turn, opening_turns
from mascot.evaluation.conversations import read_conversations
from mascot.evaluation.metrics import automatic_metrics
from mascot.evaluation.systems import SYSTEMS
from mascot.judges.base import JudgeItem
from mascot.judges.group import BlockItem
from mascot.judges.panel import PanelSpec, check_failure_rate, judgments_frame, make_panel
from mascot.llm import request_batch, run_requests, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.roster import Roster
from mascot.rubrics import Rubric

AUTOMATIC = "automatic"
PERSONA, COLLECTIVE = "persona", "collective"
# `n`: the items a judge scored (companion turns, or 1 conversation); `items`: the items there were to score, so a
# judge that failed on one of them shows n < items and the conversation's panel is incomplete.
SCORE_SCHEMA = {"system": pl.String, "context_id": pl.String, "seed": pl.Int64, "level": pl.String,
                "judge": pl.String, "metric": pl.String, "value": pl.Float64, "n": pl.Int64, "items": pl.Int64,
                "training_seed": pl.Int64}


class ScoringJob(BaseModel):
    """The panels, the rosters the speakers come from, and where the requests go (a step's cache key)."""

    model_config = ConfigDict(frozen=True)

    persona_panel: PanelSpec
    group_panel: PanelSpec
    roster: Roster
    assistant: Roster
    contexts: Artifact
    seed: int
    requests: Path
    max_judge_failure_rate: float = 0.1


def conversation_id(system: str, context_id: str, seed: int, training_seed: int = 0) -> str:
    """A conversation's id in the judges' requests: training seed 0's as it was before training seeds existed."""
    return f"{system}|{context_id}|s{seed}" + (f"|r{training_seed}" if training_seed else "")


def turn_context(context: Context, roster: Roster, prior: list[Turn]) -> Context:
    """The context with the conversation's earlier turns appended, as a persona-level judge reads a turn."""
    def message(turn: Turn) -> Message:
        role = "user" if turn.speaker == USER else "assistant"
        return Message(role=role, content=turn.text.strip() or "(empty)",
                       name=roster.get(turn.speaker).name if turn.role == "companion" else None)

    return context.model_copy(update={"history": [*context.history, *(message(t) for t in prior)]})


def _played(conversations: Artifact) -> dict:
    """Each conversation's (system, context id, seed, training seed, companion texts), by its conversation id."""
    return {conversation_id(*key): (*key, [t.text for t in turns if t.role == "companion"])
            for key, turns in read_conversations(conversations).items()}


def judge_conversations(job: ScoringJob, conversations: Artifact, out: Path) -> Artifact:
    """Judge every companion turn and every conversation of one shard of conversations; write the judgments.

    A shard is one played conversation shard, judged as soon as it is played. So a request that exhausts its
    retries fails (and cancels) one shard's requests, not the whole evaluation's, the step's retry resumes from
    the request cache, and only the shards in flight hold rendered prompts.
    """
    cache = shared_cache(job.requests)
    contexts = read_contexts(job.contexts)
    turn_items, block_items = [], []
    for (system, context_id, seed, training_seed), turns in read_conversations(conversations).items():
        context = contexts[context_id]
        roster = job.roster if SYSTEMS[system].group else job.assistant
        key = conversation_id(system, context_id, seed, training_seed)
        for index, turn in enumerate(turns):
            if turn.role == "companion":
                turn_items.append(JudgeItem(f"{key}|t{index}", 0, turn_context(context, roster, turns[:index]),
                                            roster.get(turn.speaker), turn.text))
        block_items.append(BlockItem(key, 0, context, roster, opening_turns(context), turns))

    persona_judges, group_judges = make_panel(job.persona_panel, cache=cache), make_panel(job.group_panel, cache=cache)
    total = len(turn_items) * len(persona_judges.judges) + len(block_items) * len(group_judges.judges)
    with shard_progress(f"judging {out.stem}", total, cache_hits(cache)) as row, request_batch():
        async def both():
            return await asyncio.gather(
                persona_judges.judge_all(turn_items, job.seed, on_start=row.started, on_done=lambda _: row.finished()),
                group_judges.judge_all(block_items, job.seed, on_start=row.started, on_done=lambda _: row.finished()))

        persona_judgments, group_judgments = run_requests(both())
    persona = judgments_frame(persona_judgments, job.persona_panel.rubric).with_columns(level=pl.lit(PERSONA))
    group = judgments_frame(group_judgments, job.group_panel.rubric).with_columns(level=pl.lit(COLLECTIVE))
    return write_parquet(pl.concat([persona, group], how="diagonal"), out)


def score_conversations(job: ScoringJob, conversations: Artifact, judgments: Artifact, out: Path) -> Artifact:
    """The per-conversation scores from every shard's judgments (merged) and the automatic metrics; stops the run
    when a level's judges failed more often than `job.max_judge_failure_rate`."""
    frame, played = judgments.read_parquet(), _played(conversations)
    persona, group = (frame.filter(pl.col("level") == level) for level in (PERSONA, COLLECTIVE))
    for level in (persona, group):
        check_failure_rate(level, job.max_judge_failure_rate)

    rows = [*_judge_rows(persona, job.persona_panel.rubric, PERSONA, played),
            *_judge_rows(group, job.group_panel.rubric, COLLECTIVE, played)]
    for system, context_id, seed, training_seed, texts in played.values():
        rows += [{"system": system, "context_id": context_id, "seed": seed, "level": AUTOMATIC, "judge": AUTOMATIC,
                  "metric": metric, "value": value, "n": len(texts), "items": len(texts), "training_seed": training_seed}
                 for metric, value in automatic_metrics(texts).items()]
    return write_parquet(pl.DataFrame(rows, schema=SCORE_SCHEMA), out)


def _judge_rows(frame: pl.DataFrame, rubric: Rubric, level: str, played: dict) -> list[dict]:
    """Per conversation, judge and criterion (and overall): the mean 0–100 score of its judged items (the
    module's linear map)."""
    metrics = [*rubric.criterion_ids, "overall"]
    ok = frame.filter(pl.col("ok")).with_columns(
        conversation=pl.col("query_id").str.replace(r"\|t\d+$", ""),
        **{metric: (pl.col(metric) - rubric.scale_min) * 100 / rubric.span for metric in metrics})
    summary = ok.group_by("conversation", "judge").agg(pl.len().alias("n"), *(pl.col(m).mean() for m in metrics))
    rows = []
    for record in summary.sort("conversation", "judge").iter_rows(named=True):
        system, context_id, seed, training_seed, texts = played[record["conversation"]]
        items = len(texts) if level == "persona" else 1  # every companion turn, or the whole conversation
        rows += [{"system": system, "context_id": context_id, "seed": seed, "level": level, "judge": record["judge"],
                  "metric": metric, "value": record[metric], "n": record["n"], "items": items,
                  "training_seed": training_seed} for metric in metrics]
    return rows
