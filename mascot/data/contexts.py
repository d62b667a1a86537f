"""contexts.parquet: the contexts a run works on, and which of them are held out of all training.

Every stage reads its contexts from this one file. The held-out split is decided here, once, and
stored as the `held_out` column: the reward models, the policies and every comparison read it
rather than computing it again, so they cannot disagree about it.

The split is by the unit of independence, stored as the `cluster` column (`context_cluster`): a
QMSum meeting, whose windows share their participants, their queries and their text, or a single
conversation elsewhere. A cluster is held out whole, so no held-out context shares a meeting with a
training context.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import polars as pl

from mascot.artifacts import Artifact, write_parquet
from mascot.data import load_corpus
from mascot.data.context import Context

if TYPE_CHECKING:
    from pathlib import Path

    from mascot.config import DataConfig


def context_cluster(context: Context) -> str:
    """The unit of independence a context belongs to: its meeting for QMSum (by the transcript's digest, so a
    meeting read twice, or from two splits, is one cluster), and the context itself elsewhere (an Empathetic
    Dialogues or ESConv context is one conversation)."""
    meeting = context.metadata.get("meeting_id")
    if context.source == "qmsum" and meeting:
        return f"qmsum:{str(meeting).split('-')[0]}"
    return context.id


def held_out_contexts(context_ids: Iterable[str], fraction: float, seed: int,
                      clusters: Mapping[str, str] | None = None) -> set[str]:
    """A seeded, stable share of clusters (at least one, never all) kept out of training, with all their contexts.

    `clusters` maps a context id to its cluster (`context_cluster`); without it every context is its own. The
    share is of clusters, not contexts. Membership depends on the cluster id and seed alone, so adding contexts
    to a corpus does not move existing ones across the split. With fewer than two clusters nothing is held
    out, and the trainers say that there is nothing to evaluate on.
    """
    ids = sorted(set(context_ids))
    cluster_of = {c: (clusters or {}).get(c, c) for c in ids}
    units = sorted(set(cluster_of.values()))
    if len(units) < 2:
        return set()
    count = min(len(units) - 1, max(1, math.ceil(fraction * len(units))))
    ranked = sorted(units, key=lambda u: hashlib.sha256(f"{seed}\x1f{u}".encode()).hexdigest())
    held = set(ranked[:count])
    return {c for c in ids if cluster_of[c] in held}


def write_contexts(data: DataConfig, seed: int, out: Path) -> Artifact:
    """Load the training corpus (a seeded subsample) into contexts.parquet, with its held-out split."""
    contexts = load_corpus(data.corpus, seed=seed)
    clusters = {c.id: context_cluster(c) for c in contexts}
    return write_context_table(contexts, held_out_contexts(clusters, data.held_out_fraction, seed, clusters), out)


def write_context_table(contexts: list[Context], held_out: set[str], out: Path) -> Artifact:
    """contexts.parquet for these contexts, `held_out` marking the ones kept out of all training."""
    clusters = {c.id: context_cluster(c) for c in contexts}
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
            "cluster": [clusters[c.id] for c in contexts],
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


def context_clusters(artifact: Artifact) -> dict[str, str]:
    """Each context id's cluster: the unit that the split holds out whole, and so the unit an interval resamples."""
    frame = artifact.read_parquet()
    return dict(zip(frame["context_id"].to_list(), frame["cluster"].to_list(), strict=True))


def held_out_ids(artifact: Artifact) -> set[str]:
    """The context ids that contexts.parquet marks as held out."""
    frame = artifact.read_parquet()
    return set(frame.filter(pl.col("held_out"))["context_id"].to_list())
