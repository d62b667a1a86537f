"""Evidence that the Director learned: the base Director and the trained one on held-out states.

Both policies sample `samples_per_prompt` directives for every held-out state with the same
request seeds (`sample_directors`). Every sample is read as written and scored by the Director's
reward functions as during training (`score_directors`): its validity (the format reward) and the
group reward model's score of the block it leads to, the mean over `rollouts` rollouts, each with
its own seed (training's reward has its own count). `compare_directors` averages the samples per
state and gives the paired (trained - base) differences a bootstrap interval, and each policy's
directive validity a bootstrap interval over states, with the fallback counts. `reward_signal`
splits the spread of the group reward model's score into the rollouts' noise and the spread
between directives.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import polars as pl

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json, write_parquet
from mascot.config import BeforeAfterConfig, DirectorConfig, DirectorEvalConfig, GRPOPolicyConfig
from mascot.dialogue.directives import director_messages
from mascot.llm import make_backend, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.queries import request_seed
from mascot.stage2.branching import CastSpec
from mascot.stage2.director import director_rewards, split_states
from mascot.stats import clustered_mean, describe, paired_difference
from mascot.train.grpo import policy_backend

POLICIES = ("base", "director")
SCORES = ("reward", "group_rm", "format")


def sample_directors(policy: GRPOPolicyConfig, compare: BeforeAfterConfig, cast_spec: CastSpec, seed: int,
                     episodes: Artifact, contexts: Artifact, adapter: Artifact, requests: Path, out: Path) -> Artifact:
    """`samples_per_prompt` directives of each policy at every held-out state, with the same seeds for both."""
    cache = shared_cache(requests)
    _, held_out = split_states(episodes, contexts)
    rows = []
    for name in POLICIES:
        config = policy_backend(policy, adapter.verified() if name == "director" else None)
        with shard_progress(f"sampling held-out directives ({name})", len(held_out), cache_hits(cache)) as row:
            sampled = asyncio.run(_sample(make_backend(config, cache=cache), config.params, cast_spec, held_out,
                                          compare.samples_per_prompt, seed, row))
        rows += [{"state_id": state.id, "policy": name, "sample_idx": i, "text": text}
                 for state, texts in zip(held_out, sampled, strict=True) for i, text in enumerate(texts)]
    return write_parquet(pl.DataFrame(rows, schema={"state_id": pl.String, "policy": pl.String,
                                                    "sample_idx": pl.Int64, "text": pl.String}), out)


async def _sample(backend, params, cast_spec: CastSpec, states, n: int, seed: int, row) -> list[list[str]]:
    async def one(state) -> list[str]:
        row.started()
        texts = await backend.generate(director_messages(cast_spec.roster, state.state), n=n, params=params,
                                       seed=request_seed(seed, state.id, "director_eval"))
        row.finished()
        return texts

    return list(await asyncio.gather(*(one(state) for state in states)))


def score_directors(config: DirectorConfig, evaluation: DirectorEvalConfig, cast_spec: CastSpec, block_turns: int,
                    seed: int, episodes: Artifact, contexts: Artifact, group_rm: Artifact, samples: Artifact,
                    requests: Path, out: Path) -> Artifact:
    """Every reward term of every sampled directive, and their weighted sum (`reward`), as in training; the
    group reward model's term is the mean over the directive's rollouts (`group_rm_rollouts`)."""
    frame = samples.read_parquet()
    _, held_out = split_states(episodes, contexts)
    (group, format_), weights = director_rewards(config, cast_spec, held_out, group_rm.verified(), block_turns, seed,
                                                 requests)
    states, texts = frame["state_id"].to_list(), frame["text"].to_list()
    draws = group.rollouts(states, texts, evaluation.rollouts)
    rollouts = group.score(states, draws)
    completions = [[{"role": "assistant", "content": text}] for text in texts]
    scores = {"group_rm": [statistics.fmean(r) for r in rollouts], "format": format_([], completions)}
    blocks = draws[0]
    frame = frame.with_columns(
        reward=pl.Series([weights[0] * g + weights[1] * f for g, f in zip(*scores.values(), strict=True)]),
        group_rm=pl.Series(scores["group_rm"]), format=pl.Series(scores["format"]),
        group_rm_rollouts=pl.Series(rollouts, dtype=pl.List(pl.Float64)),
        valid=pl.Series([f == 1.0 for f in scores["format"]]),
        next_speaker=pl.Series([block[0].speaker for block in blocks]),
        block=pl.Series([[turn.text for turn in block] for block in blocks]),
    )
    return write_parquet(frame, out)


def compare_directors(compare: BeforeAfterConfig, seed: int, scored: Artifact, out: Path) -> Artifact:
    """samples.parquet and metrics.json (per score: each policy's mean, the paired difference; validity)."""
    samples = scored.read_parquet()
    with atomic_dir(out) as staging:
        write_parquet(samples, staging / "samples.parquet")
        write_json(director_metrics(samples, compare, seed), staging / "metrics.json")
    return dir_artifact(out)


def director_metrics(samples: pl.DataFrame, compare: BeforeAfterConfig, seed: int) -> dict:
    per_state = samples.group_by("state_id", "policy").agg(pl.col(SCORES).mean()).sort("state_id", "policy")
    metrics = {"states": per_state["state_id"].n_unique(), "samples_per_prompt": compare.samples_per_prompt,
               "scores": {}, "validity": {}, "fallbacks": {}}
    for score in SCORES:
        wide = per_state.pivot(on="policy", index="state_id", values=score).drop_nulls(list(POLICIES))
        metrics["scores"][score] = {
            "base": describe(wide["base"].to_list()), "director": describe(wide["director"].to_list()),
            "difference": paired_difference(wide["base"].to_list(), wide["director"].to_list(), compare.confidence,
                                            compare.bootstrap_resamples, seed),
        }
    for policy in POLICIES:
        rows = samples.filter(pl.col("policy") == policy).sort("state_id", "sample_idx")
        # Samples of one state are not independent: the interval resamples states.
        metrics["validity"][policy] = clustered_mean(rows["valid"].cast(pl.Float64).to_list(), rows["state_id"].to_list(),
                                                     compare.confidence, compare.bootstrap_resamples, seed)
        metrics["fallbacks"][policy] = int((~rows["valid"]).sum())
    metrics["signal"] = reward_signal(samples)
    return metrics


def reward_signal(samples: pl.DataFrame) -> dict:
    """How much of the group reward model's score a Director can change: a one-way random-effects split.

    `rollout_sd`: the spread of one directive's rollouts (the Speaker's and the rest of the block's
    sampling), pooled over directives. `directive_sd`: the spread between the directives of one state
    (both policies' samples) beyond what that noise adds to a mean of `rollouts` rollouts, pooled
    over states; it is the part a directive decides. Null with fewer than 2 rollouts.
    """
    rollouts = samples["group_rm_rollouts"].list.len().min() or 0
    signal = {"rollouts": rollouts, "directives": samples.height, "states": samples["state_id"].n_unique(),
              "rollout_sd": None, "directive_sd": None}
    if rollouts < 2:
        return signal
    noise = samples["group_rm_rollouts"].list.var().mean()
    spread = samples.group_by("state_id").agg(pl.col("group_rm").var()).get_column("group_rm").drop_nulls().mean()
    signal["rollout_sd"] = noise ** 0.5
    if spread is not None:
        signal["directive_sd"] = max(spread - noise / rollouts, 0.0) ** 0.5
    return signal
