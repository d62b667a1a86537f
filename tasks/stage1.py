"""Prefect tasks of Stage 1: each a thin wrapper over one library call.

A task takes a few named inputs (a config section, artifacts, an output path) and returns an
artifact. Sampling, judging, training and comparison tasks are cached by `artifact_cache_key`;
each writes its output under a name that carries its key (`keyed`), and their results (paths and
hashes) are persisted inside the run directory. LLM tasks retry with backoff, training tasks retry
once from their last checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.tasks import exponential_backoff

from mascot.artifacts import Artifact, merge_parquet
from mascot.config import (
    BackendConfig,
    BeforeAfterConfig,
    DataConfig,
    RewardModelConfig,
    SpeakerConfig,
    Stage1Config,
)
from mascot.data import contexts as contexts_io
from mascot.judges.panel import PanelSpec
from mascot.queries import Queries
from mascot.stage1 import before_after, candidates, judging, pairs, persona_swap, speaker
from mascot.train.launch import launched
from mascot.train.reward_model import train_reward_model
from mascot.train.runtime import TrainingSetupError
from tasks.caching import CACHED, keyed
from tasks.failures import REPORTED

LLM_RETRIES = {"retries": 3, "retry_delay_seconds": exponential_backoff(backoff_factor=5)}


def _not_a_setup_error(task, task_run, state) -> bool:
    """Retry a training task unless it failed on its inputs or the machine, which a retry won't fix."""
    return not isinstance(state.result(raise_on_failure=False), TrainingSetupError)


# A retried training task resumes from its last checkpoint rather than starting over.
TRAINING_RETRIES = {"retries": 1, "retry_delay_seconds": 5, "retry_condition_fn": _not_a_setup_error}


@task(**REPORTED)
def write_contexts(data: DataConfig, seed: int, out: Path) -> Artifact:
    # Not cached: reading the corpus is cheap, and a changed corpus file must be noticed.
    # Identical contexts give an identical hash, so downstream caches still hit.
    return contexts_io.write_contexts(data, seed, out)


# No tags on LLM tasks: a tagged task run asks the Prefect server for tag concurrency slots, a round
# trip per shard, and requests are limited per backend anyway (`mascot.llm.limits`).
@task(**CACHED, **REPORTED, **LLM_RETRIES)
def sample_candidates(generation: BackendConfig, k: int, seed: int, shard: Queries, requests: Path,
                      out: Path) -> Artifact:
    return candidates.sample_shard(generation, k, seed, shard, requests, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def judge_candidates(panel: PanelSpec, seed: int, shard: Queries, replies: Artifact, requests: Path,
                     out: Path) -> Artifact:
    return judging.judge_shard(panel, seed, shard, replies, requests, keyed(out))


@task(**CACHED, **REPORTED)
def merge_shards(shards: list[Artifact], out: Path) -> Artifact:
    return merge_parquet(shards, keyed(out))


@task(**CACHED, **REPORTED)
def build_pairs(stage1: Stage1Config, queries: Queries, replies: Artifact, judgments: Artifact,
                out: Path) -> Artifact:
    return pairs.build_pairs(stage1, queries, replies, judgments, keyed(out))


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_persona_rm(config: RewardModelConfig, pairs: Artifact, contexts: Artifact, out: Path) -> Artifact:
    # Held-out pair accuracy compares replies under one persona; the swap test checks the model reads the persona.
    return launched(config, train_reward_model, config, pairs, contexts, keyed(out), group_by="persona",
                    name="persona_rm", held_out_measures={"persona_swap": persona_swap.held_out_persona_swap})


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_speaker(config: SpeakerConfig, queries: Queries, persona_rm: Artifact, out: Path) -> Artifact:
    return launched(config, speaker.train_speaker, config, queries, persona_rm, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def sample_policies(config: SpeakerConfig, compare: BeforeAfterConfig, held_out: Queries, adapter: Artifact,
                    requests: Path, out: Path) -> Artifact:
    return before_after.sample_policies(config, compare, held_out, adapter, requests, keyed(out))


@task(**CACHED, **REPORTED)
def score_replies(config: SpeakerConfig, held_out: Queries, persona_rm: Artifact, samples: Artifact,
                  out: Path) -> Artifact:
    return before_after.score_replies(config, held_out, persona_rm, samples, keyed(out))


@task(**CACHED, **REPORTED)
def compare_policies(compare: BeforeAfterConfig, seed: int, scored: Artifact, judgments: Artifact,
                     contexts: Artifact, out: Path) -> Artifact:
    return before_after.compare_policies(compare, seed, scored, judgments, contexts, keyed(out))
