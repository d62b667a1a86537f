"""Evidence that the Speaker learned: the base policy and the trained Speaker on held-out prompts.

Both policies answer every held-out (context, persona) prompt with the same request seeds
(`sample_policies`). Each reply is scored by the Speaker's reward functions exactly as during
training (`score_replies`) and by the judge panel (`mascot.stage1.judging.judge_shard`). Replies are
averaged per prompt, and the per-prompt differences (Speaker - base) get a bootstrap interval
over contexts (the personas' prompts of one context are not independent) and a paired BCa
bootstrap interval over prompts (`compare_policies`). The held-out contexts are the ones contexts.parquet marks as held
out, which neither the reward model nor the Speaker was trained on.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import polars as pl

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json, write_parquet
from mascot.config import BeforeAfterConfig, SpeakerConfig
from mascot.data.contexts import context_clusters
from mascot.judges.panel import aggregate_scores
from mascot.llm import make_backend, run_requests, shared_cache
from mascot.llm.transformers_backend import models_released
from mascot.progress import cache_hits, shard_progress
from mascot.prompts import speaker_messages
from mascot.queries import Queries, cluster_ids
from mascot.stage1.candidates import sample_candidates
from mascot.stage1.rewards import speaker_reward_weights, speaker_rewards
from mascot.stats import clustered_mean, describe, paired_difference
from mascot.train.grpo import policy_backend

POLICIES = ("base", "speaker")
SCORES = ("reward", "persona_rm", "format", "conciseness", "judge")


def sample_policies(speaker: SpeakerConfig, compare: BeforeAfterConfig, held_out: Queries, adapter: Artifact,
                    requests: Path, out: Path) -> Artifact:
    """`samples_per_prompt` replies of each policy to every held-out prompt, with the same seeds for both."""
    cache = shared_cache(requests)
    queries, n = held_out.load(), compare.samples_per_prompt
    rows = []
    for index, policy in enumerate(POLICIES):
        config = policy_backend(speaker, adapter.verified() if policy == "speaker" else None)
        # The same seeds for both policies: their samples differ only by the adapter.
        # One policy in memory at a time: the base's copy leaves before the adapter's loads.
        with models_released(), shard_progress(f"sampling held-out prompts ({policy})", len(queries),
                                               cache_hits(cache)) as row:
            sampled = run_requests(sample_candidates(make_backend(config, cache=cache), queries, n, config.params,
                                                    speaker.seed, on_start=row.started, on_done=row.finished))
        rows += [{"query_id": s.query.id, "persona": s.query.persona.id, "policy": policy, "sample_idx": i,
                  "candidate_idx": index * n + i, "text": text} for s in sampled for i, text in enumerate(s.texts)]
    return write_parquet(pl.DataFrame(rows), out)


def score_replies(speaker: SpeakerConfig, held_out: Queries, persona_rm: Artifact, samples: Artifact,
                  out: Path) -> Artifact:
    """Every reward term of every sampled reply, and their weighted sum (`reward`), as in training."""
    frame = samples.read_parquet()
    query_by_id = {q.id: q for q in held_out.load()}
    prompts = [speaker_messages(query_by_id[q].persona, query_by_id[q].context) for q in frame["query_id"]]
    completions = [[{"role": "assistant", "content": text}] for text in frame["text"]]
    functions = speaker_rewards(speaker, held_out.roster, persona_rm.verified())
    scores = {f.__name__: f(prompts, completions) for f in functions}
    weights = dict(zip(scores, speaker_reward_weights(speaker), strict=True))
    frame = frame.with_columns(
        reward=pl.Series([sum(weights[name] * values[i] for name, values in scores.items())
                          for i in range(frame.height)]),
        **{name: pl.Series(values) for name, values in scores.items()},
    )
    return write_parquet(frame, out)


def compare_policies(compare: BeforeAfterConfig, seed: int, scored: Artifact, judgments: Artifact,
                     contexts: Artifact, out: Path) -> Artifact:
    """The scored replies with the panel's score (`judge`), and the comparison over `contexts`' clusters;
    samples.parquet and metrics.json in `out`."""
    judged = judgments.read_parquet()
    overall = aggregate_scores(judged, "mean").select("query_id", "candidate_idx", pl.col("overall").alias("judge"))
    samples = scored.read_parquet().join(overall, on=["query_id", "candidate_idx"], how="left", maintain_order="left")
    with atomic_dir(out) as staging:
        write_parquet(samples.drop("candidate_idx"), staging / "samples.parquet")
        write_json(before_after_metrics(samples, compare, seed, judge_failures=int((~judged["ok"]).sum()),
                                        clusters=context_clusters(contexts)), staging / "metrics.json")
    return dir_artifact(out)


def before_after_metrics(samples: pl.DataFrame, compare: BeforeAfterConfig, seed: int, judge_failures: int,
                         clusters: Mapping[str, str] | None = None) -> dict:
    """Per score: each policy's mean ± sd over prompts, and the paired Speaker - base difference, with an interval
    over the contexts' clusters (`cluster_ids`)."""
    # Sorted: the bootstrap resamples rows by position, so their order must not depend on hashing.
    per_prompt = samples.group_by("query_id", "persona", "policy").agg(pl.col(SCORES).mean()).sort("query_id", "policy")
    metrics = {"prompts": per_prompt["query_id"].n_unique(), "samples_per_prompt": compare.samples_per_prompt,
               "judge_failures": judge_failures, "scores": {}, "by_persona": {}}
    for score in SCORES:
        wide = per_prompt.pivot(on="policy", index=["query_id", "persona"], values=score).drop_nulls(list(POLICIES))
        differences = (wide["speaker"] - wide["base"]).to_list()
        metrics["scores"][score] = {
            "base": describe(wide["base"].to_list()), "speaker": describe(wide["speaker"].to_list()),
            "difference": paired_difference(wide["base"].to_list(), wide["speaker"].to_list(), compare.confidence,
                                            compare.bootstrap_resamples, seed),
            # The personas' prompts of one context (or one meeting) are not independent: this interval resamples
            # clusters.
            "difference_by_context": clustered_mean(differences, cluster_ids(wide["query_id"], clusters),
                                                    compare.confidence, compare.bootstrap_resamples, seed),
        }
        for (persona,), group in sorted(wide.group_by("persona"), key=lambda item: item[0]):
            metrics["by_persona"].setdefault(persona, {})[score] = {
                "n": group.height, "base_mean": group["base"].mean(), "speaker_mean": group["speaker"].mean()}
    return metrics
