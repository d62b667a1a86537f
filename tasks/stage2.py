"""Prefect tasks of Stage 2: each a thin wrapper over one library call, cached and retried like Stage 1's."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from mascot.artifacts import Artifact, merge_parquet
from mascot.config import (
    BeforeAfterConfig,
    DirectorConfig,
    DirectorDPOConfig,
    DirectorEvalConfig,
    EpisodeConfig,
    GRPOPolicyConfig,
    RewardModelConfig,
    Stage2Config,
)
from mascot.judges.panel import PanelSpec
from mascot.roster import Roster
from mascot.stage2 import branching, director, director_eval, trajectories
from mascot.stage2.branching import CastSpec, Contexts
from mascot.train.reward_model import train_reward_model
from tasks.caching import CACHED, keyed
from tasks.failures import REPORTED
from tasks.stage1 import LLM_RETRIES, TRAINING_RETRIES


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def generate_episodes(cast: CastSpec, episodes: EpisodeConfig, seed: int, shard: Contexts, requests: Path,
                      out: Path) -> Artifact:
    return branching.generate_shard(cast, episodes, seed, shard, requests, keyed(out))


@task(**CACHED, **REPORTED)
def merge_episodes(shards: list[Artifact], out: Path) -> Artifact:
    return merge_parquet(shards, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def judge_blocks(panel: PanelSpec, roster: Roster, seed: int, episodes: Artifact, contexts: Artifact,
                 requests: Path, out: Path) -> Artifact:
    return trajectories.judge_blocks(panel, roster, seed, episodes, contexts, requests, keyed(out))


@task(**CACHED, **REPORTED)
def build_group_pairs(stage2: Stage2Config, roster: Roster, episodes: Artifact, contexts: Artifact,
                      judgments: Artifact, out: Path) -> Artifact:
    return trajectories.build_group_pairs(stage2, roster, episodes, contexts, judgments, keyed(out))


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_group_rm(config: RewardModelConfig, pairs: Artifact, contexts: Artifact, out: Path) -> Artifact:
    # Held-out accuracy by the persona the chosen branch's first directive named.
    return train_reward_model(config, pairs, contexts, keyed(out), group_by="persona", name="group_rm")


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_director(config: DirectorConfig, cast: CastSpec, block_turns: int, seed: int, episodes: Artifact,
                   contexts: Artifact, group_rm: Artifact, requests: Path, out: Path) -> Artifact:
    return director.train_director(config, cast, block_turns, seed, episodes, contexts, group_rm, requests, keyed(out))


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_director_dpo(config: DirectorDPOConfig, pairs: Artifact, contexts: Artifact, out: Path) -> Artifact:
    return director.train_director_dpo(config, pairs, contexts, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def sample_directors(policy: GRPOPolicyConfig, compare: BeforeAfterConfig, cast: CastSpec, seed: int,
                     episodes: Artifact, contexts: Artifact, adapter: Artifact, requests: Path, out: Path) -> Artifact:
    return director_eval.sample_directors(policy, compare, cast, seed, episodes, contexts, adapter, requests, keyed(out))


@task(**CACHED, **REPORTED)
def score_directors(config: DirectorConfig, evaluation: DirectorEvalConfig, cast: CastSpec, block_turns: int,
                    seed: int, episodes: Artifact, contexts: Artifact, group_rm: Artifact, samples: Artifact,
                    requests: Path, out: Path) -> Artifact:
    return director_eval.score_directors(config, evaluation, cast, block_turns, seed, episodes, contexts, group_rm,
                                         samples, requests, keyed(out))


@task(**CACHED, **REPORTED)
def compare_directors(compare: BeforeAfterConfig, seed: int, scored: Artifact, out: Path) -> Artifact:
    return director_eval.compare_directors(compare, seed, scored, keyed(out))
