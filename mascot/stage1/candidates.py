"""Sampling K candidate replies for (context, persona) queries, and the sampling step of a shard.

Every request carries a seed derived from the run seed and the query, so a rerun asks exactly the
same questions and is answered from the request cache.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from mascot.artifacts import Artifact, write_parquet
from mascot.config import BackendConfig, SamplingParams
from mascot.llm import LLMBackend, make_backend, request_batch, run_requests, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.prompts import speaker_messages
from mascot.queries import Queries, Query, request_seed

CANDIDATE_SCHEMA = {"query_id": pl.String, "context_id": pl.String, "persona": pl.String, "candidate_idx": pl.Int64,
                    "text": pl.String, "model": pl.String, "sampling": pl.String}


@dataclass(frozen=True)
class Candidates:
    query: Query
    texts: list[str]


async def sample_candidates(
    backend: LLMBackend,
    queries: list[Query],
    k: int,
    params: SamplingParams,
    run_seed: int,
    on_start: Callable[[], None] | None = None,
    on_done: Callable[[], None] | None = None,
) -> list[Candidates]:
    """Sample `k` replies per query. All queries are in flight at once; the backend limits concurrency."""

    async def one(query: Query) -> Candidates:
        messages = speaker_messages(query.persona, query.context)
        if on_start is not None:
            on_start()
        texts = await backend.generate(messages, n=k, params=params, seed=request_seed(run_seed, query.id))
        if on_done is not None:
            on_done()
        return Candidates(query, texts)

    return list(await asyncio.gather(*(one(q) for q in queries)))


def sample_shard(generation: BackendConfig, k: int, seed: int, shard: Queries, requests: Path, out: Path) -> Artifact:
    """K candidates for each query of one shard, through the request cache at `requests`."""
    cache = shared_cache(requests)
    backend = make_backend(generation, cache=cache)
    queries = shard.load()
    with shard_progress(f"sampling {out.stem}", len(queries), cache_hits(cache)) as row, request_batch():
        results = run_requests(sample_candidates(backend, queries, k, generation.params, seed,
                                                on_start=row.started, on_done=row.finished))
    sampling = json.dumps({**generation.params.model_dump(mode="json"), "seed": seed}, sort_keys=True)
    rows = [
        {"query_id": r.query.id, "context_id": r.query.context.id, "persona": r.query.persona.id,
         "candidate_idx": i, "text": text, "model": backend.model, "sampling": sampling}
        for r in results for i, text in enumerate(r.texts)
    ]
    return write_parquet(pl.DataFrame(rows, schema=CANDIDATE_SCHEMA), out)
