"""The evaluation's conversations: every system answers every evaluation context, once per seed.

`eval/contexts.parquet` holds what is evaluated: Stage 1's held-out contexts (`eval_set`
"held_out"), and the contexts of each `data.held_out` corpus (`eval_set` "<source>:<split>", with
`out_of_domain` true where the corpus is not the training corpus's, as ESConv is for a roster
trained on Empathetic Dialogues). No training step ever read any of them.

A conversation is `eval.blocks` blocks after the context, the simulated user's turn between two.
A system built from the trained Speaker or Director plays them once per training seed
(eval.training_seeds), each with that seed's adapters; its rows say which (`training_seed`, 0 for a
system played once). Its requests are seeded by the evaluation seed, the context and the turn's position,
never by the system or the training seed: every system's Speaker, and the user in every conversation, draw the same random
numbers at the same place (common random numbers), so differences between systems are not
differences of luck. conversations.parquet has one row per turn after the context.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.artifacts import Artifact, write_parquet
from mascot.config import DataConfig
from mascot.data import load_corpus
from mascot.data.contexts import context_cluster, read_contexts
from mascot.dialogue.episodes import Episode, choose_profile, play, row_turn, turn_row
from mascot.dialogue.turns import Turn, opening_turns
from mascot.evaluation.systems import AssistantReplies, SystemSetup
from mascot.llm import request_batch, run_requests, shared_cache
from mascot.progress import cache_hits, shard_progress

PATH = "eval"  # the seed path of every system's turns: the same for all of them
CONVERSATION_SCHEMA = {
    "system": pl.String, "context_id": pl.String, "seed": pl.Int64, "user_profile": pl.String, "block": pl.Int64,
    "turn_idx": pl.Int64, "role": pl.String, "speaker": pl.String, "text": pl.String, "request_seed": pl.Int64,
    "directive": pl.String, "director_seed": pl.Int64, "directive_attempts": pl.Int64, "fallback": pl.Boolean,
    "samples": pl.Int64, "reasoning_marked": pl.Boolean, "reasoning_attempts": pl.Int64, "training_seed": pl.Int64,
}


def write_eval_contexts(data: DataConfig, stage1_contexts: Artifact, seed: int, out_of_domain: bool,
                        out: Path) -> Artifact:
    """Stage 1's held-out contexts, then (with `out_of_domain`) every context of data.held_out's corpora, each
    with its `cluster` (the unit of independence: a meeting, or the conversation itself) and the number of
    training contexts in that cluster, which must be 0: an evaluation context whose meeting also gave a
    training context is refused (ValueError), since its participants, queries and text were trained on."""
    stage1 = with_clusters(stage1_contexts.read_parquet())
    training = stage1.filter(~pl.col("held_out"))
    frame = stage1.filter(pl.col("held_out")).drop("held_out")
    frame = frame.with_columns(eval_set=pl.lit("held_out"), out_of_domain=pl.lit(False))
    frames = [frame]
    for corpus in data.held_out if out_of_domain else []:
        contexts = load_corpus(corpus, seed=seed)
        frames.append(pl.DataFrame({
            "context_id": [c.id for c in contexts], "domain": [c.domain for c in contexts],
            "source": [c.source for c in contexts], "split": [c.split for c in contexts],
            "valence": [c.valence for c in contexts], "meeting_type": [c.meeting_type for c in contexts],
            "history": [[m.model_dump() for m in c.history] for c in contexts],
            "metadata": [json.dumps(c.metadata, sort_keys=True, default=str) for c in contexts],
            "cluster": [context_cluster(c) for c in contexts],
            "eval_set": f"{corpus.source}:{corpus.split}", "out_of_domain": corpus.source != data.corpus.source,
        }, schema=frame.schema))
    merged = pl.concat(frames)
    repeated = merged.filter(pl.col("context_id").is_duplicated())["context_id"].unique().to_list()
    if repeated:
        raise ValueError(f"evaluation contexts repeat across sets (ids {repeated[:3]}): a held-out corpus overlaps "
                         "the training corpus's held-out contexts")
    in_training = training.group_by("cluster").agg(pl.col("context_id").sort().alias("training_ids"))
    merged = merged.join(in_training, on="cluster", how="left").with_columns(
        training_contexts_in_cluster=pl.col("training_ids").list.len().fill_null(0).cast(pl.Int64))
    leaked = merged.filter(pl.col("training_contexts_in_cluster") > 0)
    if not leaked.is_empty():
        first = leaked.row(0, named=True)
        raise ValueError(
            f"{leaked.height} evaluation context(s) share their cluster (meeting or conversation) with training "
            f"contexts, so a training step read their participants, queries and text: {first['context_id']} "
            f"({first['eval_set']}) is in cluster {first['cluster']} with training context(s) "
            f"{', '.join(first['training_ids'][:3])}. Held-out corpora must not hold a meeting of the training "
            "corpus; Stage 1's split holds meetings out whole (run stage1 again if its contexts.parquet predates it)")
    return write_parquet(merged.drop("training_ids"), out)


def with_clusters(frame: pl.DataFrame) -> pl.DataFrame:
    """contexts.parquet with its `cluster` column; one written before the column existed gets it from each
    context's source and metadata, as `context_cluster` gives it."""
    if "cluster" in frame.columns:
        return frame
    clusters = [context_cluster(context) for context in contexts_of(frame)]
    return frame.with_columns(cluster=pl.Series(clusters, dtype=pl.String))


def contexts_of(frame: pl.DataFrame):
    from mascot.data.context import Context

    for row in frame.iter_rows(named=True):
        yield Context(id=row["context_id"], domain=row["domain"], source=row["source"], split=row["split"],
                      history=[{k: v for k, v in m.items() if v is not None} for m in row["history"]],
                      metadata=json.loads(row["metadata"]))


class ConversationJob(BaseModel):
    """What a shard of conversations needs besides its contexts (a step's input and cache key)."""

    model_config = ConfigDict(frozen=True)

    system: SystemSetup
    contexts: Artifact
    seeds: list[int]
    blocks: int
    requests: Path


async def converse(cast, setup: SystemSetup, episode: Episode, blocks: int) -> list[Turn]:
    """`blocks` blocks of the system's turns after the context, the user's turn between two."""
    played: list[Turn] = []
    opening = opening_turns(episode.context)
    for block in range(blocks):
        played += await play(cast, episode, [*opening, *played], setup.block_turns, PATH,
                             user_after=block < blocks - 1)
    return played


def play_shard(job: ConversationJob, ids: list[str], out: Path) -> Artifact:
    """The system's conversations of some contexts, for every seed, all in flight at once."""
    cache = shared_cache(job.requests)
    setup = job.system
    cast = setup.cast(cache)
    by_id = read_contexts(job.contexts)
    episodes = [Episode(by_id[i], choose_profile(setup.profiles, by_id[i], seed), seed)
                for seed in job.seeds for i in ids]

    async def run(row) -> list[list[Turn]]:
        async def one(episode: Episode) -> list[Turn]:
            row.started()
            turns = await converse(cast, setup, episode, job.blocks)
            row.finished()
            return turns

        return list(await asyncio.gather(*(one(episode) for episode in episodes)))

    with shard_progress(f"{setup.name} {out.stem}", len(episodes), cache_hits(cache)) as row, request_batch():
        played = run_requests(run(row))
    cot = isinstance(cast.speaker, AssistantReplies) and setup.cot
    marked, attempts = (cast.speaker.marked, cast.speaker.attempts) if cot else ({}, {})
    rows = []
    for episode, turns in zip(episodes, played, strict=True):
        start, per_block = len(opening_turns(episode.context)), setup.block_turns + 1
        for k, turn in enumerate(turns):
            stored = turn_row(turn)
            stored["request_seed"] = stored.pop("seed")  # `seed` is the evaluation seed of the conversation
            rows.append({"system": setup.name, "context_id": episode.id, "seed": episode.run_seed,
                         "user_profile": episode.profile.id if episode.profile else None, "block": k // per_block,
                         "turn_idx": start + k, **stored,
                         "samples": setup.samples if turn.role == "companion" else None,
                         "reasoning_marked": marked.get(turn.seed) if turn.role == "companion" else None,
                         "reasoning_attempts": attempts.get(turn.seed) if turn.role == "companion" else None,
                         "training_seed": setup.training_seed})
    return write_parquet(pl.DataFrame(rows, schema=CONVERSATION_SCHEMA), out)


def with_training_seed(frame: pl.DataFrame) -> pl.DataFrame:
    """A frame of conversations, scores or preferences with its `training_seed` column: the training run the
    system's trained parts came from (eval.training_seeds), 0 for a system played once and in a file from before
    the column."""
    if "training_seed" not in frame.columns:
        return frame.with_columns(training_seed=pl.lit(0, pl.Int64))
    return frame.with_columns(pl.col("training_seed").fill_null(0))


def read_conversations(conversations: Artifact) -> dict[tuple[str, str, int, int], list[Turn]]:
    """Every conversation of conversations.parquet, by (system, context id, evaluation seed, training seed), its
    turns in order, each with its own request seed."""
    played = {}
    for key, rows in with_training_seed(conversations.read_parquet()).group_by(
            "system", "context_id", "seed", "training_seed", maintain_order=True):
        played[key] = [row_turn({**row, "seed": row["request_seed"]})
                       for row in rows.sort("turn_idx").iter_rows(named=True)]
    return played


def of_training_seed(played: dict[tuple[str, str, int, int], list[Turn]], training_seed: int = 0
                     ) -> dict[tuple[str, str, int], list[Turn]]:
    """The conversations of one training seed (and of every system played once), by (system, context id, seed)."""
    return {key[:3]: turns for key, turns in played.items() if key[3] == training_seed}
