"""Stage 1 data steps on artifacts: contexts, K-candidate sampling, judging, preference pairs.

Each function reads its inputs from the run directory, checks their hashes, and writes one
artifact atomically. `tasks/stage1.py` wraps each in a Prefect task; a notebook can call them
directly. Sampling and judging work on shards of queries, so a crash costs at most one shard,
and the request cache under the backends means not even that shard pays twice.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import polars as pl
from pydantic import BaseModel

from mascot.artifacts import Artifact, write_parquet
from mascot.candidates import Query, sample_candidates
from mascot.config import BackendConfig, CorpusConfig, JudgeConfig, Stage1Config
from mascot.data import Context, load_corpus
from mascot.judges.base import Judge, JudgeItem
from mascot.judges.panel import JudgePanel, aggregate_scores, check_failure_rate, judgments_frame, make_judge
from mascot.judges.rubrics import Rubric
from mascot.llm import LLMBackend, RequestCache
from mascot.pairs import build_preference_pairs
from mascot.progress import cache_hits, shard_progress
from mascot.prompts import speaker_messages
from mascot.roster import Roster

CANDIDATE_SCHEMA = {"query_id": pl.String, "context_id": pl.String, "persona": pl.String, "candidate_idx": pl.Int64,
                    "text": pl.String, "model": pl.String, "sampling": pl.String}


class PairSettings(BaseModel):
    """The slice of `stage1` config that decides the pairs (and so their cache key)."""

    margin: float
    max_pairs_per_query: int | None
    aggregation: str
    max_judge_failure_rate: float

    @classmethod
    def of(cls, stage1: Stage1Config) -> PairSettings:
        return cls(**stage1.model_dump(include=set(cls.model_fields)))


def write_contexts(corpus: CorpusConfig, seed: int, out: Path) -> Artifact:
    """Load the training corpus (seeded subsample) into contexts.parquet."""
    contexts = load_corpus(corpus, seed=seed)
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


def plan_shards(contexts: Artifact, roster: Roster, shard_size: int) -> list[list[str]]:
    """Query ids ((context, persona) pairs over enabled personas) cut into shards, in a fixed order."""
    context_ids = contexts.read_parquet()["context_id"].to_list()
    query_ids = [Query.make_id(c, p.id) for c in context_ids for p in roster.active]
    return [query_ids[i:i + shard_size] for i in range(0, len(query_ids), shard_size)]


def _queries(query_ids: list[str], contexts: dict[str, Context], roster: Roster) -> list[Query]:
    queries = []
    for query_id in query_ids:
        context_id, persona_id = Query.split_id(query_id)
        queries.append(Query(contexts[context_id], roster.get(persona_id)))
    return queries


def sample_shard(
    backend: LLMBackend, generation: BackendConfig, k: int, seed: int, contexts: Artifact, roster: Roster,
    query_ids: list[str], out: Path, cache: RequestCache | None = None,
) -> Artifact:
    """K candidates for each query of one shard, written to a shard parquet file."""
    queries = _queries(query_ids, read_contexts(contexts), roster)
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


_caches: dict[Path, RequestCache] = {}
_caches_lock = threading.Lock()


def shared_cache(path: Path) -> RequestCache:
    """One request cache per file and process, so its hit and miss counts cover the whole run."""
    with _caches_lock:  # shards start in several threads at once
        if path not in _caches:
            _caches[path] = RequestCache(path)
        return _caches[path]


def cache_stats(path: Path) -> dict[str, float]:
    return shared_cache(path).stats().as_dict()


def make_judges(judges: list[JudgeConfig], rubric: Rubric, model_paths: dict[str, str],
                cache_path: Path) -> list[Judge]:
    """The configured panel; `model_paths` maps model references (e.g. tiny:lm) to loadable paths."""
    cache = shared_cache(cache_path)
    return [make_judge(judge, rubric, cache=cache,
                       model_path=model_paths.get(judge.backend.model) if judge.backend else None)
            for judge in judges]


def judge_shard(
    judges: list[Judge], rubric: Rubric, seed: int, contexts: Artifact, roster: Roster, candidates: Artifact,
    out: Path, cache: RequestCache | None = None,
) -> Artifact:
    """Every judge scores every candidate of one shard; failures are recorded, never scored."""
    context_by_id = read_contexts(contexts)
    items = [
        JudgeItem(query_id=row["query_id"], candidate_idx=row["candidate_idx"],
                  context=context_by_id[row["context_id"]], persona=roster.get(row["persona"]),
                  candidate=row["text"])
        for row in candidates.read_parquet().iter_rows(named=True)
    ]
    panel = JudgePanel(judges, aggregation="mean")
    with shard_progress(f"judging {out.stem}", len(items) * len(judges), cache_hits(cache)) as row:
        judgments = asyncio.run(panel.judge_all(items, seed, on_start=row.started, on_done=lambda _: row.finished()))
    return write_parquet(judgments_frame(judgments, rubric), out)


def merge_shards(shards: list[Artifact], out: Path) -> Artifact:
    return write_parquet(pl.concat([shard.read_parquet() for shard in shards], how="vertical"), out)


def build_pairs(settings: PairSettings, contexts: Artifact, roster: Roster, candidates: Artifact,
                judgments: Artifact, out: Path) -> Artifact:
    """Aggregate the panel's scores and keep the candidate pairs whose gap reaches the margin."""
    judged = judgments.read_parquet()
    check_failure_rate(judged, settings.max_judge_failure_rate)
    scores = aggregate_scores(judged, settings.aggregation)
    pairs = build_preference_pairs(candidates.read_parquet(), scores, margin=settings.margin,
                                   max_pairs_per_query=settings.max_pairs_per_query)
    # The prompt a reward model and the Speaker see: the persona's speaker prompt and the context.
    queries = _queries(pairs["query_id"].unique(maintain_order=True).to_list(), read_contexts(contexts), roster)
    prompts = pl.DataFrame(
        {"query_id": [q.id for q in queries], "prompt": [speaker_messages(q.persona, q.context) for q in queries]},
        schema={"query_id": pl.String, "prompt": pl.List(pl.Struct({"role": pl.String, "content": pl.String}))},
    )
    return write_parquet(pairs.join(prompts, on="query_id", how="left", maintain_order="left"), out)


