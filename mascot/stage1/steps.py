"""Stage 1 data steps on artifacts: K-candidate sampling, judging and preference pairs.

Each function reads its inputs from the run directory, checks their hashes, and writes one
artifact atomically. `tasks/stage1.py` wraps each in a Prefect task; a notebook can call them
directly. Sampling and judging work on shards of queries, so a crash costs at most one shard,
and the request cache under the backends means not even that shard pays twice.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl

from mascot.artifacts import Artifact, write_parquet
from mascot.config import BackendConfig, Stage1Config
from mascot.judges.base import JudgeItem
from mascot.judges.panel import PanelSpec, aggregate_scores, check_failure_rate, judgments_frame, make_panel
from mascot.llm import make_backend, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.prompts import speaker_messages
from mascot.queries import Queries
from mascot.stage1.candidates import sample_candidates
from mascot.stage1.pairs import build_preference_pairs

CANDIDATE_SCHEMA = {"query_id": pl.String, "context_id": pl.String, "persona": pl.String, "candidate_idx": pl.Int64,
                    "text": pl.String, "model": pl.String, "sampling": pl.String}


def sample_shard(generation: BackendConfig, k: int, seed: int, shard: Queries, requests: Path, out: Path) -> Artifact:
    """K candidates for each query of one shard, through the request cache at `requests`."""
    cache = shared_cache(requests)
    backend = make_backend(generation, cache=cache)
    queries = shard.load()
    with shard_progress(f"sampling {out.stem}", len(queries), cache_hits(cache)) as row:
        results = asyncio.run(sample_candidates(backend, queries, k, generation.params, seed,
                                                on_start=row.started, on_done=row.finished))
    sampling = json.dumps({**generation.params.model_dump(mode="json"), "seed": seed}, sort_keys=True)
    rows = [
        {"query_id": r.query.id, "context_id": r.query.context.id, "persona": r.query.persona.id,
         "candidate_idx": i, "text": text, "model": backend.model, "sampling": sampling}
        for r in results for i, text in enumerate(r.texts)
    ]
    return write_parquet(pl.DataFrame(rows, schema=CANDIDATE_SCHEMA), out)


def judge_shard(panel: PanelSpec, seed: int, shard: Queries, candidates: Artifact, requests: Path,
                out: Path) -> Artifact:
    """Every judge scores every candidate of one shard; failures are recorded, never scored.

    `candidates` needs query_id, candidate_idx and text; the query id names the context and persona.
    """
    cache = shared_cache(requests)
    judges = make_panel(panel, cache=cache)
    query_by_id = {q.id: q for q in shard.load()}
    items = [
        JudgeItem(query_id=row["query_id"], candidate_idx=row["candidate_idx"],
                  context=query_by_id[row["query_id"]].context, persona=query_by_id[row["query_id"]].persona,
                  candidate=row["text"])
        for row in candidates.read_parquet().iter_rows(named=True)
    ]
    with shard_progress(f"judging {out.stem}", len(items) * len(judges.judges), cache_hits(cache)) as row:
        judgments = asyncio.run(judges.judge_all(items, seed, on_start=row.started, on_done=lambda _: row.finished()))
    return write_parquet(judgments_frame(judgments, panel.rubric), out)


def merge_shards(shards: list[Artifact], out: Path) -> Artifact:
    return write_parquet(pl.concat([shard.read_parquet() for shard in shards], how="vertical"), out)


def build_pairs(stage1: Stage1Config, queries: Queries, candidates: Artifact, judgments: Artifact,
                out: Path) -> Artifact:
    """Aggregate the panel's scores and keep the candidate pairs whose gap reaches the margin."""
    judged = judgments.read_parquet()
    check_failure_rate(judged, stage1.max_judge_failure_rate)
    scores = aggregate_scores(judged, stage1.aggregation)
    pairs = build_preference_pairs(candidates.read_parquet(), scores, margin=stage1.margin,
                                   max_pairs_per_query=stage1.max_pairs_per_query)
    # The prompt a reward model and the Speaker see: the persona's speaker prompt and the context.
    paired = set(pairs["query_id"].to_list())
    queried = [q for q in queries.load() if q.id in paired]
    prompts = pl.DataFrame(
        {"query_id": [q.id for q in queried], "prompt": [speaker_messages(q.persona, q.context) for q in queried]},
        schema={"query_id": pl.String, "prompt": pl.List(pl.Struct({"role": pl.String, "content": pl.String}))},
    )
    return write_parquet(pairs.join(prompts, on="query_id", how="left", maintain_order="left"), out)
