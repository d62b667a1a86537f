"""The judging step of a shard: every judge of a panel scores every candidate of the shard.

Failures are recorded and counted, never scored (see `mascot.judges.panel`).
"""

from __future__ import annotations

from pathlib import Path

from mascot.artifacts import Artifact, write_parquet
from mascot.judges.base import JudgeItem
from mascot.judges.panel import PanelSpec, judgments_frame, make_panel
from mascot.llm import request_batch, run_requests, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.queries import Queries


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
    with shard_progress(f"judging {out.stem}", len(items) * len(judges.judges), cache_hits(cache)) as row, \
            request_batch():
        judgments = run_requests(judges.judge_all(items, seed, on_start=row.started, on_done=lambda _: row.finished()))
    return write_parquet(judgments_frame(judgments, panel.rubric), out)
