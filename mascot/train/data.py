"""What the trainers see: one held-out split of contexts, preference records and Speaker prompts.

The split is by context, so no query (context, persona) and no conversation is in both the
training and the held-out side. The reward model, the Speaker and the before/after comparison all
use the same split: the comparison's prompts were never trained on by either model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import polars as pl

from mascot.candidates import Query
from mascot.data import Context
from mascot.prompts import speaker_messages
from mascot.roster import Roster
from mascot.train.runtime import TrainingSetupError


def held_out_contexts(context_ids: Iterable[str], fraction: float, seed: int) -> set[str]:
    """A seeded, stable share of contexts (at least one, never all) kept out of training.

    Membership depends on the context id and seed alone, so adding contexts to a corpus does not
    move existing ones across the split.
    """
    ids = sorted(set(context_ids))
    if len(ids) < 2:
        raise TrainingSetupError(f"a held-out split needs at least 2 contexts, got {len(ids)}; "
                                 "raise data.corpus.limit")
    count = min(len(ids) - 1, max(1, math.ceil(fraction * len(ids))))
    ranked = sorted(ids, key=lambda c: hashlib.sha256(f"{seed}\x1f{c}".encode()).hexdigest())
    return set(ranked[:count])


def is_held_out(query_ids: pl.Series, held_out: set[str]) -> pl.Series:
    return query_ids.map_elements(lambda q: Query.split_id(q)[0] in held_out, return_dtype=pl.Boolean)


def preference_records(pairs: pl.DataFrame) -> list[dict]:
    """TRL's conversational preference format with an explicit prompt (persona system prompt + context)."""
    return [
        {"prompt": row["prompt"], "chosen": [{"role": "assistant", "content": row["chosen"]}],
         "rejected": [{"role": "assistant", "content": row["rejected"]}]}
        for row in pairs.iter_rows(named=True)
    ]


def speaker_queries(contexts: dict[str, Context], roster: Roster, context_ids: Iterable[str]) -> list[Query]:
    """Every (context, enabled persona) query over the given contexts, in a fixed order."""
    return [Query(contexts[c], persona) for c in sorted(context_ids) for persona in roster.active]


def prompt_records(queries: list[Query]) -> list[dict]:
    """TRL's conversational prompt-only format, with the query and persona kept for logging."""
    return [{"prompt": speaker_messages(q.persona, q.context), "query_id": q.id, "persona": q.persona.id}
            for q in queries]
