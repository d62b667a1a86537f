"""contexts.parquet: the contexts a run works on, and which of them are held out of all training.

Every stage reads its contexts from this one file. The held-out split is decided here, once, and
stored as the `held_out` column: the reward models, the policies and every comparison read it
rather than computing it again, so they cannot disagree about it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import polars as pl

from mascot.artifacts import Artifact, write_parquet
from mascot.data import load_corpus
from mascot.data.context import Context

if TYPE_CHECKING:
    from pathlib import Path

    from mascot.config import DataConfig


def held_out_contexts(context_ids: Iterable[str], fraction: float, seed: int) -> set[str]:
    """A seeded, stable share of contexts (at least one, never all) kept out of training.

    Membership depends on the context id and seed alone, so adding contexts to a corpus does not
    move existing ones across the split. With fewer than two contexts nothing is held out, and the
    trainers say that there is nothing to evaluate on.
    """
    ids = sorted(set(context_ids))
    if len(ids) < 2:
        return set()
    count = min(len(ids) - 1, max(1, math.ceil(fraction * len(ids))))
    ranked = sorted(ids, key=lambda c: hashlib.sha256(f"{seed}\x1f{c}".encode()).hexdigest())
    return set(ranked[:count])


def write_contexts(data: DataConfig, seed: int, out: Path) -> Artifact:
    """Load the training corpus (a seeded subsample) into contexts.parquet, with its held-out split."""
    contexts = load_corpus(data.corpus, seed=seed)
    return write_context_table(contexts, held_out_contexts((c.id for c in contexts), data.held_out_fraction, seed), out)


def write_context_table(contexts: list[Context], held_out: set[str], out: Path) -> Artifact:
    """contexts.parquet for these contexts, `held_out` marking the ones kept out of all training."""
    frame = pl.DataFrame(
        {
            "context_id": [c.id for c in contexts],
            "domain": [c.domain for c in contexts],
            "source": [c.source for c in contexts],
            "split": [c.split for c in contexts],
            "valence": [c.valence for c in contexts],
            "meeting_type": [c.meeting_type for c in contexts],
            "history": [[m.model_dump() for m in c.history] for c in contexts],
            "metadata": [json.dumps(c.metadata, sort_keys=True, default=str) for c in contexts],
            "held_out": [c.id in held_out for c in contexts],
        },
        schema_overrides={"valence": pl.String, "meeting_type": pl.String},
    )
    return write_parquet(frame, out)


def read_contexts(artifact: Artifact) -> dict[str, Context]:
    contexts = {}
    for row in artifact.read_parquet().iter_rows(named=True):
        history = [{k: v for k, v in m.items() if v is not None} for m in row["history"]]
        contexts[row["context_id"]] = Context(
            id=row["context_id"], domain=row["domain"], source=row["source"], split=row["split"],
            valence=row["valence"], meeting_type=row["meeting_type"], history=history,
            metadata=json.loads(row["metadata"]),
        )
    return contexts


def held_out_ids(artifact: Artifact) -> set[str]:
    """The context ids that contexts.parquet marks as held out."""
    frame = artifact.read_parquet()
    return set(frame.filter(pl.col("held_out"))["context_id"].to_list())
