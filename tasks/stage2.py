"""Prefect tasks of Stage 2: each a thin wrapper over one library call, cached and retried like Stage 1's.

Steps that play episodes take the `Setting` they share (the cast, how episodes run, the run seed,
the contexts and the request cache); the others take only what they read.
"""

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
    RewardModelConfig,
    Stage2Config,
)
from mascot.judges.panel import PanelSpec
from mascot.roster import Roster
from mascot.stage2 import branching, director, director_eval, trajectories
from mascot.stage2.branching import Setting
from mascot.stage2.director_eval import Directors
from mascot.train.launch import launched
from mascot.train.reward_model import train_reward_model
from tasks.caching import CACHED, keyed
from tasks.failures import REPORTED
from tasks.stage1 import LLM_RETRIES, TRAINING_RETRIES


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def generate_episodes(setting: Setting, ids: list[str], out: Path) -> Artifact:
    return branching.generate_shard(setting, ids, keyed(out))


@task(**CACHED, **REPORTED)
def merge_episodes(shards: list[Artifact], out: Path) -> Artifact:
    return merge_parquet(shards, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def judge_trajectories(panel: PanelSpec, setting: Setting, episodes: Artifact, out: Path) -> Artifact:
    return trajectories.judge_trajectories(panel, setting, episodes, keyed(out))


@task(**CACHED, **REPORTED)
def build_group_pairs(stage2: Stage2Config, roster: Roster, episodes: Artifact, contexts: Artifact,
                      judgments: Artifact, out: Path) -> Artifact:
    return trajectories.build_group_pairs(stage2, roster, episodes, contexts, judgments, keyed(out))


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_group_rm(config: RewardModelConfig, pairs: Artifact, contexts: Artifact, out: Path) -> Artifact:
    # Held-out accuracy by the persona the chosen trajectory's first directive named.
    return launched(config, train_reward_model, config, pairs, contexts, keyed(out), group_by="persona",
                    name="group_rm")


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_director(config: DirectorConfig, setting: Setting, episodes: Artifact, group_rm: Artifact,
                   out: Path) -> Artifact:
    return launched(config, director.train_director, config, setting, episodes, group_rm, keyed(out))


@task(**CACHED, **REPORTED, **TRAINING_RETRIES, tags=["training"])
def train_director_dpo(config: DirectorDPOConfig, pairs: Artifact, contexts: Artifact, episodes: EpisodeConfig,
                       out: Path) -> Artifact:
    return launched(config, director.train_director_dpo, config, pairs, contexts, episodes, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def evaluate_directors(evaluation: DirectorEvalConfig, directors: Directors, setting: Setting, episodes: Artifact,
                       group_rm: Artifact, out: Path) -> Artifact:
    return director_eval.evaluate_directors(evaluation, directors, setting, episodes, group_rm, keyed(out))


@task(**CACHED, **REPORTED)
def compare_directors(compare: BeforeAfterConfig, seed: int, scored: Artifact, contexts: Artifact,
                      out: Path) -> Artifact:
    return director_eval.compare_directors(compare, seed, scored, contexts, keyed(out))
