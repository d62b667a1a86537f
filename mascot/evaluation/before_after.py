"""Evidence that the Speaker learned: the base policy and the trained Speaker on held-out prompts.

Both policies answer every held-out (context, persona) prompt with the same request seeds. Each
reply is scored by the persona reward model, the judge panel and the format and conciseness
rewards, exactly as during training. Replies are averaged per prompt, and the per-prompt
differences (Speaker - base) get a paired bootstrap interval. The held-out contexts are the ones
kept out of reward-model and Speaker training (`mascot.train.data.held_out_contexts`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import polars as pl
from pydantic import BaseModel

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json, write_parquet
from mascot.candidates import sample_candidates
from mascot.config import BackendConfig, BeforeAfterConfig, RunConfig, SamplingParams, SpeakerTrainConfig
from mascot.evaluation.stats import describe, paired_difference
from mascot.judges.base import Judge, JudgeItem
from mascot.judges.panel import JudgePanel, aggregate_scores, judgments_frame
from mascot.judges.rubrics import Rubric
from mascot.llm import RequestCache, make_backend
from mascot.progress import cache_hits, shard_progress
from mascot.prompts import speaker_messages
from mascot.roster import Roster
from mascot.stage1 import read_contexts
from mascot.train.data import held_out_contexts, speaker_queries
from mascot.train.grpo import reward_weights, speaker_rewards

POLICIES = ("base", "speaker")
SCORES = ("reward", "persona_rm", "format", "conciseness", "judge")


class BeforeAfterSettings(BaseModel):
    """Everything that decides the comparison (and so the task's cache key)."""

    base_model: str
    device: str
    params: SamplingParams
    rewards: SpeakerTrainConfig
    compare: BeforeAfterConfig
    held_out_fraction: float
    seed: int

    @classmethod
    def of(cls, config: RunConfig, base_model: str) -> BeforeAfterSettings:
        """Both policies sample as the Speaker did in GRPO, in this process (`base_model` resolved)."""
        generation, speaker = config.generation, config.train.speaker
        params = SamplingParams(temperature=speaker.temperature, top_p=generation.params.top_p,
                                max_new_tokens=speaker.max_completion_length, stop=generation.params.stop,
                                chat_template_kwargs=generation.params.chat_template_kwargs)
        return cls(base_model=base_model, device=generation.device if generation.kind == "transformers" else "auto",
                   params=params, rewards=speaker, compare=config.train.before_after,
                   held_out_fraction=config.train.held_out_fraction, seed=config.run.seed)


def compare_speakers(settings: BeforeAfterSettings, contexts: Artifact, roster: Roster, persona_rm: Artifact,
                     speaker: Artifact, judges: list[Judge], rubric: Rubric, out: Path,
                     cache: RequestCache | None = None) -> Artifact:
    """Sample, score and compare both policies; write samples.parquet and metrics.json to `out`."""
    by_id = read_contexts(contexts)
    queries = speaker_queries(by_id, roster, held_out_contexts(by_id, settings.held_out_fraction, settings.seed))
    n = settings.compare.samples_per_prompt
    rows = []
    for index, policy in enumerate(POLICIES):
        backend = make_backend(
            BackendConfig(kind="transformers", model=settings.base_model, device=settings.device,
                          adapter=speaker.verified() if policy == "speaker" else None),
            cache=cache)
        # The same seeds for both policies: their samples differ only by the adapter.
        with shard_progress(f"sampling held-out prompts ({policy})", len(queries), cache_hits(cache)) as row:
            sampled = asyncio.run(sample_candidates(backend, queries, n, settings.params, settings.seed,
                                                    on_start=row.started, on_done=row.finished))
        rows += [{"query_id": s.query.id, "persona": s.query.persona.id, "policy": policy, "sample_idx": i,
                  "candidate_idx": index * n + i, "text": text} for s in sampled for i, text in enumerate(s.texts)]
    samples = pl.DataFrame(rows)
    query_by_id = {q.id: q for q in queries}
    prompts = [speaker_messages(query_by_id[q].persona, query_by_id[q].context) for q in samples["query_id"]]
    completions = [[{"role": "assistant", "content": text}] for text in samples["text"]]
    functions = speaker_rewards(settings.rewards, roster, persona_rm.verified(), settings.params.chat_template_kwargs)
    scores = {f.__name__: f(prompts, completions) for f in functions}
    weights = dict(zip(scores, reward_weights(settings.rewards), strict=True))
    samples = samples.with_columns(
        reward=pl.Series([sum(weights[name] * values[i] for name, values in scores.items())
                          for i in range(samples.height)]),
        **{name: pl.Series(values) for name, values in scores.items()},
    )
    items = [JudgeItem(query_id=row["query_id"], candidate_idx=row["candidate_idx"],
                       context=query_by_id[row["query_id"]].context, persona=query_by_id[row["query_id"]].persona,
                       candidate=row["text"]) for row in samples.iter_rows(named=True)]
    with shard_progress("judging held-out replies", len(items) * len(judges), cache_hits(cache)) as row:
        judgments = asyncio.run(JudgePanel(judges).judge_all(items, settings.seed, on_start=row.started,
                                                             on_done=lambda _: row.finished()))
    judged = judgments_frame(judgments, rubric)
    overall = aggregate_scores(judged, "mean").select("query_id", "candidate_idx", pl.col("overall").alias("judge"))
    samples = samples.join(overall, on=["query_id", "candidate_idx"], how="left", maintain_order="left")

    with atomic_dir(out) as staging:
        write_parquet(samples.drop("candidate_idx"), staging / "samples.parquet")
        write_json(before_after_metrics(samples, settings.compare, settings.seed,
                                        judge_failures=int((~judged["ok"]).sum())), staging / "metrics.json")
    return dir_artifact(out)


def before_after_metrics(samples: pl.DataFrame, compare: BeforeAfterConfig, seed: int, judge_failures: int) -> dict:
    """Per score: each policy's mean ± sd over prompts, and the paired Speaker - base difference."""
    # Sorted: the bootstrap resamples rows by position, so their order must not depend on hashing.
    per_prompt = samples.group_by("query_id", "persona", "policy").agg(pl.col(SCORES).mean()).sort("query_id", "policy")
    metrics = {"prompts": per_prompt["query_id"].n_unique(), "samples_per_prompt": compare.samples_per_prompt,
               "judge_failures": judge_failures, "scores": {}, "by_persona": {}}
    for score in SCORES:
        wide = per_prompt.pivot(on="policy", index=["query_id", "persona"], values=score).drop_nulls(list(POLICIES))
        metrics["scores"][score] = {
            "base": describe(wide["base"].to_list()), "speaker": describe(wide["speaker"].to_list()),
            "difference": paired_difference(wide["base"].to_list(), wide["speaker"].to_list(), compare.confidence,
                                            compare.bootstrap_resamples, seed),
        }
        for (persona,), group in sorted(wide.group_by("persona"), key=lambda item: item[0]):
            metrics["by_persona"].setdefault(persona, {})[score] = {
                "n": group.height, "base_mean": group["base"].mean(), "speaker_mean": group["speaker"].mean()}
    return metrics
