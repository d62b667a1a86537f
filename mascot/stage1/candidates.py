"""Sampling K candidate replies for (context, persona) queries.

Every request carries a seed derived from the run seed and the query, so a rerun asks exactly the
same questions and is answered from the request cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from mascot.config import SamplingParams
from mascot.llm import LLMBackend
from mascot.prompts import speaker_messages
from mascot.queries import Query, request_seed


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
