"""Evidence that the Director learned: the base Director and the trained one on held-out states.

Both policies sample `samples_per_prompt` directives for every held-out state with the same request seeds: on
the serving engine where the base Director's server loads adapters (the trained one as a LoRA module there),
else in this process (`Directors`). Every sample is read as written and scored by the Director's reward as
during training (`mascot.stage2.director.TrajectoryRollouts`): the trajectory it opens, played to the
episode's end, in `trajectory` mode with the same policy making every later directive; its validity (1 when
the sampled directive itself is valid, the format reward); and the group reward model's score of the
trajectory, the mean over `rollouts` rollouts, each with its own seed (training's reward has its own count).
`compare_directors` averages the samples per state and gives the paired (trained - base) differences a
bootstrap interval over states, and each policy's directive validity a bootstrap interval over states, with
the fallback counts. `reward_signal` splits the spread of the group reward model's score into the rollouts'
noise and the spread between directives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json, write_parquet
from mascot.config import (
    BackendConfig,
    BeforeAfterConfig,
    DirectorEvalConfig,
    DirectorRewardWeights,
    GRPOPolicyConfig,
)
from mascot.data.contexts import context_clusters
from mascot.dialogue.directives import director_messages
from mascot.llm import make_backend, run_requests
from mascot.llm.served_adapters import served_adapter
from mascot.llm.transformers_backend import models_released
from mascot.progress import cache_hits, shard_progress
from mascot.queries import cluster_ids, context_ids, request_seed
from mascot.stage2.branching import Setting
from mascot.stage2.director import TrajectoryRollouts, split_states
from mascot.stats import clustered_mean, describe, paired_difference
from mascot.train.grpo import policy_backend
from mascot.train.runtime import trainer_device

POLICIES = ("base", "director")
SCORES = ("reward", "group_rm", "format")


class Directors(BaseModel):
    """The two Directors compared: the policy's base model, and with the trained adapter; and how a directive
    is rewarded (as in GRPO's training). Both sample on `server` where one is given (the policy's base model on
    the serving engine, `mascot.train.grpo.served_policy`), the trained one as the adapter loaded there under
    `<role>-<its hash>`, the name the evaluation's and the chat's requests use too; else in this process."""

    model_config = ConfigDict(frozen=True)

    policy: GRPOPolicyConfig
    adapter: Artifact
    weights: DirectorRewardWeights
    server: BackendConfig | None = None
    role: str = "director"

    def backend(self, name: str) -> BackendConfig:
        trained = self.adapter.verified() if name == "director" else None
        if self.server is None:
            return policy_backend(self.policy, trained)
        return served_adapter(self.server, self.role, self.adapter) if trained else self.server


def evaluate_directors(evaluation: DirectorEvalConfig, directors: Directors, setting: Setting, episodes: Artifact,
                       group_rm: Artifact, out: Path) -> Artifact:
    """Both policies' samples at every held-out state, with the same seeds for both, and every reward term
    of each, with their weighted sum (`reward`); `group_rm_rollouts` holds each rollout's score."""
    _, held_out = split_states(episodes, setting.contexts)
    rollouts = TrajectoryRollouts(setting, held_out, group_rm.verified(), trainer_device(directors.policy))
    frames = []
    for name in POLICIES:
        config = directors.backend(name)
        # One policy in memory at a time: its copy leaves once its directives are sampled and their rollouts scored.
        with models_released():
            with shard_progress(f"held-out directives ({name})", len(held_out), cache_hits(rollouts.cache)) as row:
                sampled = run_requests(_sample(make_backend(config, cache=rollouts.cache), config.params, setting,
                                              held_out, evaluation.samples_per_prompt, row))
            states = [state.id for state, texts in zip(held_out, sampled, strict=True) for _ in texts]
            texts = [text for texts in sampled for text in texts]
            terms = rollouts.terms(states, texts, evaluation.rollouts, config)
        frames.append(pl.DataFrame({
            "state_id": states, "policy": name, "sample_idx": [i for texts in sampled for i in range(len(texts))],
            "text": texts,
            "reward": [directors.weights.group_rm * g + directors.weights.format * f
                       for g, f in zip(terms["group_rm"], terms["format"], strict=True)],
            "group_rm": terms["group_rm"], "format": terms["format"],
            "group_rm_rollouts": pl.Series(terms["group_rm_rollouts"], dtype=pl.List(pl.Float64)),
            "valid": [not trajectory[0].fallback for trajectory in terms["trajectories"]],
            "next_speaker": [trajectory[0].speaker for trajectory in terms["trajectories"]],
            "trajectory": [[turn.text for turn in trajectory] for trajectory in terms["trajectories"]],
        }, schema_overrides={"sample_idx": pl.Int64}))
    return write_parquet(pl.concat(frames), out)


async def _sample(backend, params, setting: Setting, states, n: int, row) -> list[list[str]]:
    async def one(state) -> list[str]:
        row.started()
        texts = await backend.generate(director_messages(setting.roster, state.state), n=n, params=params,
                                       seed=request_seed(setting.seed, state.id, "director_eval"))
        row.finished()
        return texts

    return list(await asyncio.gather(*(one(state) for state in states)))


def compare_directors(compare: BeforeAfterConfig, seed: int, scored: Artifact, contexts: Artifact,
                      out: Path) -> Artifact:
    """samples.parquet and metrics.json (per score: each policy's mean, the paired difference; validity), with
    intervals over `contexts`' clusters."""
    samples = scored.read_parquet()
    with atomic_dir(out) as staging:
        write_parquet(samples, staging / "samples.parquet")
        write_json(director_metrics(samples, compare, seed, context_clusters(contexts)), staging / "metrics.json")
    return dir_artifact(out)


def director_metrics(samples: pl.DataFrame, compare: BeforeAfterConfig, seed: int,
                     clusters: Mapping[str, str] | None = None) -> dict:
    """Per score: each policy's mean, the paired difference over states and its interval over the contexts'
    clusters (`cluster_ids`); each policy's validity and fallbacks; the reward signal."""
    per_state = samples.group_by("state_id", "policy").agg(pl.col(SCORES).mean()).sort("state_id", "policy")
    metrics = {"states": per_state["state_id"].n_unique(),
               "contexts": context_ids(per_state["state_id"]).n_unique(),
               "samples_per_prompt": compare.samples_per_prompt, "scores": {}, "validity": {}, "fallbacks": {}}
    for score in SCORES:
        wide = per_state.pivot(on="policy", index="state_id", values=score).drop_nulls(list(POLICIES))
        base, trained = wide["base"].to_list(), wide["director"].to_list()
        metrics["scores"][score] = {
            "base": describe(base), "director": describe(trained),
            "difference": paired_difference(base, trained, compare.confidence, compare.bootstrap_resamples, seed),
            # The states of one context share its conversation (a meeting's windows, its meeting): the interval
            # resamples clusters.
            "by_context": clustered_mean([t - b for b, t in zip(base, trained, strict=True)],
                                         cluster_ids(wide["state_id"], clusters), compare.confidence,
                                         compare.bootstrap_resamples, seed),
        }
    for policy in POLICIES:
        rows = samples.filter(pl.col("policy") == policy).sort("state_id", "sample_idx")
        # Samples of one state, and states of one context, are not independent: the interval resamples clusters.
        metrics["validity"][policy] = clustered_mean(rows["valid"].cast(pl.Float64).to_list(),
                                                     cluster_ids(rows["state_id"], clusters), compare.confidence,
                                                     compare.bootstrap_resamples, seed)
        metrics["fallbacks"][policy] = int((~rows["valid"]).sum())
    metrics["signal"] = reward_signal(samples, compare.confidence, compare.bootstrap_resamples, seed, clusters)
    return metrics


def reward_signal(samples: pl.DataFrame, confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
                  clusters: Mapping[str, str] | None = None) -> dict:
    """How much of the group reward model's score a Director can change, from a directive × draw layout.

    Only distinct valid directives count: an invalid one is the fallback's, not the Director's, and two
    samples of the same directive meet the same rollouts (seeded by state and draw), so repeating one
    would shrink the spread between directives. Rollouts share seeds within a state, so part of their
    noise is common to its directives and cancels between them. `rollout_sd`: the spread of one
    directive's rollouts (the sampling of the rest of the trajectory), pooled over directives.
    `unshared_sd`: the part of that noise that does not cancel between directives (the directive ×
    draw interaction). `directive_sd`: the spread between the directives of one state beyond what the
    unshared noise adds to a mean of `rollouts` rollouts, pooled over states; it is the part a directive
    decides, with a percentile bootstrap interval that resamples the contexts' clusters (`directive_sd_ci`;
    `cluster_ids`: a context's states share its conversation, a meeting's windows their meeting), whose upper
    end bounds it where the estimate is 0; null from one cluster. Null with fewer than 2 rollouts.
    """
    samples = samples.filter(pl.col("valid")).unique(["state_id", "text"], keep="first", maintain_order=True)
    rollouts = samples["group_rm_rollouts"].list.len().min() or 0
    signal = {"rollouts": rollouts, "directives": samples.height, "states": samples["state_id"].n_unique(),
              "rollout_sd": None, "unshared_sd": None, "directive_sd": None, "directive_sd_ci": None}
    if rollouts < 2:
        return signal
    signal["rollout_sd"] = samples["group_rm_rollouts"].list.head(rollouts).list.var().mean() ** 0.5
    # Per state with 2 or more directives: the variance of its directives' means, and the interaction's sum of
    # squares with its degrees of freedom.
    terms, states = [], []
    for (state_id,), state in samples.group_by("state_id", maintain_order=True):
        scores = np.array(state["group_rm_rollouts"].list.head(rollouts).to_list())  # directives × draws
        if len(scores) < 2:
            continue
        means = scores.mean(axis=1)
        interaction = scores - means[:, None] - scores.mean(axis=0)[None, :] + scores.mean()
        terms.append((means.var(ddof=1), float((interaction ** 2).sum()), (len(scores) - 1) * (rollouts - 1)))
        states.append(state_id)
    if not terms:
        return signal
    table = np.array(terms)
    units = np.array(cluster_ids(pl.Series(states), clusters))
    members = [np.flatnonzero(units == unit) for unit in dict.fromkeys(units)]

    def directive_sd(rows: np.ndarray) -> float:
        noise = rows[:, 1].sum() / rows[:, 2].sum()
        return max(float(rows[:, 0].mean()) - noise / rollouts, 0.0) ** 0.5

    signal["unshared_sd"] = float(table[:, 1].sum() / table[:, 2].sum()) ** 0.5
    signal["directive_sd"] = directive_sd(table)
    if len(members) < 2:
        return signal
    rng = np.random.default_rng(seed)
    draws = [directive_sd(table[np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])])
             for _ in range(resamples)]
    tail = (1 - confidence) / 2
    signal["directive_sd_ci"] = [float(np.quantile(draws, tail)), float(np.quantile(draws, 1 - tail))]
    return signal
