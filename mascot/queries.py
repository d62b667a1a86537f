"""Queries and request seeds: what every stage asks a model, and how each request is seeded.

A query is one (context, persona) pair: the unit that gets K candidates in Stage 1 and whose
persona speaks in a Stage 2 episode. Its id starts with the context's id, so any table keyed by
query id can be joined with contexts.parquet (for its held-out flag, say). `Queries` names a set of
them the way steps pass it: the contexts artifact, the roster, and optionally a subset of ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.artifacts import Artifact
from mascot.data.context import Context
from mascot.data.contexts import read_contexts
from mascot.roster import Persona, Roster


def request_seed(run_seed: int, *parts: str) -> int:
    """A stable 31-bit seed for one request (Python's hash() is salted per process)."""
    digest = hashlib.sha256("\x1f".join([str(run_seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class Query:
    """One (context, persona) pair."""

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


def build_queries(contexts: Iterable[Context], personas: Iterable[Persona]) -> list[Query]:
    personas = list(personas)
    return [Query(context, persona) for context in contexts for persona in personas]


def context_ids(query_ids: pl.Series) -> pl.Series:
    """The context id of each query id."""
    return query_ids.str.replace(r"\|[^|]*$", "").alias("context_id")


def cluster_ids(ids: pl.Series, clusters: Mapping[str, str] | None) -> list[str]:
    """The cluster of each query's or state's context (`context_clusters`), the unit an interval resamples: the
    windows of one meeting are not independent. Without `clusters`, each context is its own."""
    contexts = context_ids(ids).to_list()
    return contexts if clusters is None else [clusters[c] for c in contexts]


class Queries(BaseModel):
    """A set of queries as steps pass it: every (context, enabled persona) pair of a contexts file,
    or the subset `ids`. It holds the contexts' hash and the roster, so it is a sound cache key."""

    model_config = ConfigDict(frozen=True)

    contexts: Artifact
    roster: Roster
    ids: list[str] | None = None

    def all_ids(self) -> list[str]:
        """The query ids, contexts in file order, personas in roster order."""
        if self.ids is not None:
            return list(self.ids)
        in_file_order = self.contexts.read_parquet()["context_id"].to_list()
        return [Query.make_id(c, p.id) for c in in_file_order for p in self.roster.active]

    def load(self) -> list[Query]:
        by_id = read_contexts(self.contexts)
        queries = []
        for query_id in self.all_ids():
            context_id, persona_id = Query.split_id(query_id)
            queries.append(Query(by_id[context_id], self.roster.get(persona_id)))
        return queries

    def shards(self, size: int) -> list[Queries]:
        """The queries cut into shards of `size`, in a fixed order."""
        ids = self.all_ids()
        return [self.model_copy(update={"ids": ids[i:i + size]}) for i in range(0, len(ids), size)]

    def held_out(self, held: bool = True) -> Queries:
        """The queries whose contexts are held out of training (or, with `held=False`, the others),
        sorted by context id, so that their order does not depend on the corpus file's."""
        frame = self.contexts.read_parquet()
        marked = sorted(frame.filter(pl.col("held_out") == held)["context_id"].to_list())
        return self.model_copy(update={"ids": [Query.make_id(c, p.id) for c in marked for p in self.roster.active]})
