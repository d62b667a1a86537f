"""Sampling K candidate replies for (context, persona) queries.

Every request carries a seed derived from the run seed, the context and the persona, so a rerun
asks exactly the same questions and is answered from the request cache.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mascot.config import SamplingParams
from mascot.data.context import Context
from mascot.llm import LLMBackend
from mascot.prompts import speaker_messages
from mascot.roster import Persona


@dataclass(frozen=True)
class Query:
    """One (context, persona) pair: the unit that gets K candidates."""

    context: Context
    persona: Persona

    @property
    def id(self) -> str:
        return self.make_id(self.context.id, self.persona.id)

    @staticmethod
    def make_id(context_id: str, persona_id: str) -> str:
        return f"{context_id}|{persona_id}"

    @staticmethod
    def split_id(query_id: str) -> tuple[str, str]:
        """(context id, persona id); persona ids are slugs, so the last '|' separates them."""
        context_id, _, persona_id = query_id.rpartition("|")
        return context_id, persona_id


@dataclass(frozen=True)
class Candidates:
    query: Query
    texts: list[str]


def request_seed(run_seed: int, *parts: str) -> int:
    """A stable 31-bit seed for one request (Python's hash() is salted per process)."""
    digest = hashlib.sha256("\x1f".join([str(run_seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def build_queries(contexts: Iterable[Context], personas: Iterable[Persona]) -> list[Query]:
    personas = list(personas)
    return [Query(context, persona) for context in contexts for persona in personas]


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
