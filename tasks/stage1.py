"""Prefect tasks of Stage 1: each a thin wrapper over one library function.

Sampling, judging, training and comparison tasks are cached by `artifact_cache_key`; their results
(paths and hashes) are persisted inside the run directory. LLM tasks retry with backoff, training
tasks retry once from their last checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.tasks import exponential_backoff

from mascot import stage1
from mascot.artifacts import Artifact
from mascot.config import BackendConfig, CorpusConfig, JudgeConfig
from mascot.evaluation.before_after import BeforeAfterSettings, compare_speakers
from mascot.judges.rubrics import Rubric, load_rubric
from mascot.llm import make_backend
from mascot.roster import Roster
from mascot.roster import load_roster as read_roster
from mascot.train.grpo import SpeakerSettings, train_speaker
from mascot.train.reward_model import RewardModelSettings, train_reward_model
from mascot.train.runtime import TrainingSetupError
from tasks.caching import artifact_cache_key

CACHED = {"cache_key_fn": artifact_cache_key, "persist_result": True}
LLM_RETRIES = {"retries": 3, "retry_delay_seconds": exponential_backoff(backoff_factor=5)}


def _not_a_setup_error(task, task_run, state) -> bool:
    """Retry a training task unless it failed on its inputs or the machine, which a retry won't fix."""
    return not isinstance(state.result(raise_on_failure=False), TrainingSetupError)


# A retried training task resumes from its last checkpoint rather than starting over.
TRAINING_RETRIES = {"retries": 1, "retry_delay_seconds": 5, "retry_condition_fn": _not_a_setup_error}


@task
def load_roster(path: Path) -> Roster:
    return read_roster(path)


@task
def load_rubric_file(path: Path) -> Rubric:
    return load_rubric(path)


@task
def load_contexts(corpus: CorpusConfig, seed: int, out: Path) -> Artifact:
    # Not cached: reading the corpus is cheap, and a changed corpus file must be noticed.
    # Identical contexts give an identical hash, so downstream caches still hit.
    return stage1.write_contexts(corpus, seed, out)


@task(**CACHED, **LLM_RETRIES, tags=["llm"])
def sample_candidates(generation: BackendConfig, model_path: str, k: int, seed: int, contexts: Artifact,
                      roster: Roster, query_ids: list[str], request_cache: Path, out: Path) -> Artifact:
    cache = stage1.shared_cache(request_cache)
    backend = make_backend(generation, model_path=model_path, cache=cache)
    return stage1.sample_shard(backend, generation, k, seed, contexts, roster, query_ids, out, cache=cache)


@task(**CACHED, **LLM_RETRIES, tags=["llm"])
def judge_candidates(judges: list[JudgeConfig], model_paths: dict[str, str], rubric: Rubric, seed: int,
                     contexts: Artifact, roster: Roster, candidates: Artifact, request_cache: Path,
                     out: Path) -> Artifact:
    panel = stage1.make_judges(judges, rubric, model_paths, request_cache)
    return stage1.judge_shard(panel, rubric, seed, contexts, roster, candidates, out,
                              cache=stage1.shared_cache(request_cache))


@task(**CACHED)
def merge_shards(shards: list[Artifact], out: Path) -> Artifact:
    return stage1.merge_shards(shards, out)


@task(**CACHED)
def build_pairs(settings: stage1.PairSettings, contexts: Artifact, roster: Roster, candidates: Artifact,
                judgments: Artifact, out: Path) -> Artifact:
    return stage1.build_pairs(settings, contexts, roster, candidates, judgments, out)


@task(**CACHED, **TRAINING_RETRIES, tags=["training"])
def train_persona_rm(settings: RewardModelSettings, pairs: Artifact, contexts: Artifact, out: Path,
                     checkpoints: Path) -> Artifact:
    return train_reward_model(settings, pairs, contexts, out, checkpoints)


@task(**CACHED, **TRAINING_RETRIES, tags=["training"])
def train_grpo_speaker(settings: SpeakerSettings, contexts: Artifact, roster: Roster, persona_rm: Artifact,
                       out: Path, checkpoints: Path) -> Artifact:
    return train_speaker(settings, contexts, roster, persona_rm, out, checkpoints)


@task(**CACHED, **LLM_RETRIES, tags=["llm"])
def compare_before_after(settings: BeforeAfterSettings, judges: list[JudgeConfig], model_paths: dict[str, str],
                         rubric: Rubric, contexts: Artifact, roster: Roster, persona_rm: Artifact, speaker: Artifact,
                         request_cache: Path, out: Path) -> Artifact:
    panel = stage1.make_judges(judges, rubric, model_paths, request_cache)
    return compare_speakers(settings, contexts, roster, persona_rm, speaker, panel, rubric, out,
                            cache=stage1.shared_cache(request_cache))
