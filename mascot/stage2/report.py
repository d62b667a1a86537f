"""What a Stage 2 run reports: episodes, directive validity and fallbacks, group scores and pairs, the
group reward model, the Director's training, and the Director before and after on held-out states.

Every figure carries its n and an interval; shares whose items cluster (the turns of one context's
episodes, or of one meeting's windows; pairs of one context) get a bootstrap interval over the clusters.
`write_report` writes summary.json and report.md and logs to the active wandb run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from mascot.artifacts import Artifact, write_json, write_text
from mascot.data.contexts import context_clusters
from mascot.judges.panel import Aggregation, aggregate_scores
from mascot.rubrics import Rubric
from mascot.stage1.pairs import pairs_summary
from mascot.stage1.report import clustered_interval, reward_model_markdown, score_distribution
from mascot.stage2.director import DIRECTORS
from mascot.stage2.trajectories import directive_pairs
from mascot.stats import clustered_mean
from mascot.tracking import Histogram, log_metrics


def training_metrics(method: str) -> dict[str, str]:
    """The summary's training sections and the artifacts whose metrics.json they hold: the group RM's,
    and the Director's of this run's method (each method has its own folders)."""
    name = DIRECTORS[method]
    return {"group_rm": "stage2/group_rm", "director": f"stage2/{name}", "director_eval": f"stage2/{name}_eval"}


def write_report(rubric: Rubric, aggregation: Aggregation, method: str, artifacts: dict[str, Artifact],
                 contexts: Artifact, cache: dict[str, float], out: Path) -> tuple[dict[str, Any], dict[str, Artifact]]:
    frames = {name: artifacts[f"stage2/{name}"].read_parquet() for name in ("episodes", "judgments", "pairs")}
    summary = stage2_summary(rubric, aggregation, frames["episodes"], frames["judgments"], frames["pairs"], cache,
                             context_clusters(contexts))
    summary["director_method"] = method
    for key, name in training_metrics(method).items():
        if name in artifacts:
            summary[key] = json.loads((artifacts[name].verified() / "metrics.json").read_text())
    written = {"stage2/summary": write_json(summary, out / "summary.json"),
               "stage2/report": write_text(stage2_markdown(summary), out / "report.md")}
    log_metrics("stage2", wandb_metrics(summary, frames["pairs"]))
    return summary, written


def directive_counts(episodes: pl.DataFrame, clusters: Mapping[str, str]) -> dict[str, Any]:
    """Validity of the Director's directives in the episodes: turns that needed no fallback, and those
    valid at the first attempt, each with a bootstrap interval over the contexts' clusters (`context_clusters`:
    a context's episodes share its opening, and a meeting's windows are one unit); fallbacks counted."""
    turns = episodes.filter(pl.col("role") == "companion")
    valid = (~turns["fallback"]).cast(pl.Float64).to_list()
    first = ((turns["directive_attempts"] == 1) & ~turns["fallback"]).cast(pl.Float64).to_list()
    units = [clusters[context] for context in turns["context_id"]]
    return {"turns": turns.height, "fallbacks": int(turns["fallback"].sum()),
            "valid": clustered_mean(valid, units), "valid_first_attempt": clustered_mean(first, units),
            "attempts": dict(sorted((str(k), v) for k, v in turns.group_by("directive_attempts").len().iter_rows())),
            "speakers": dict(sorted(turns.group_by("speaker").len().iter_rows()))}


def first_speaker_scores(episodes: pl.DataFrame, judgments: pl.DataFrame, aggregation: Aggregation,
                         clusters: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The panel's overall score of each trajectory (`aggregate_scores`, as the pairs read it) less its state's mean, by the persona who spoke first in it,
    with a bootstrap interval over the contexts' clusters: what the Director's first choice is worth to the judge
    itself. Where every persona's interval holds 0, no reward model trained on these judgments can teach a Director
    whom to name first; where one stands out, the group reward model is the next link to read."""
    first = (episodes.filter(pl.col("branch").is_not_null(), pl.col("role") == "companion")
             .group_by("state_id", "branch")
             .agg(pl.col("speaker").sort_by("turn_idx").first(), pl.col("context_id").first()))
    overall = aggregate_scores(judgments, aggregation).rename({"query_id": "state_id", "candidate_idx": "branch"})
    rows = first.join(overall, on=["state_id", "branch"]).with_columns(
        relative=pl.col("overall") - pl.col("overall").mean().over("state_id"))
    return {speaker: clustered_mean(group["relative"].to_list(), [clusters[c] for c in group["context_id"]])
            for (speaker,), group in sorted(rows.group_by("speaker"), key=lambda item: item[0])}


def stage2_summary(rubric: Rubric, aggregation: Aggregation, episodes: pl.DataFrame, judgments: pl.DataFrame, pairs: pl.DataFrame,
                   cache: dict[str, float], clusters: Mapping[str, str]) -> dict[str, Any]:
    criteria = rubric.criterion_ids
    ok, failures = judgments.filter(pl.col("ok")), judgments.filter(~pl.col("ok"))
    n_states = episodes["state_id"].drop_nulls().n_unique()
    return {
        "counts": {"episodes": episodes["episode_id"].n_unique(), "states": n_states,
                   "branches": episodes.filter(pl.col("branch").is_not_null()).select("state_id", "branch")
                   .unique().height,
                   "turns": episodes.height, "judgments": judgments.height, "judge_failures": failures.height,
                   "pairs": pairs.height, "directive_pairs": directive_pairs(pairs).height},
        "directives": directive_counts(episodes, clusters),
        "judge_failures": {"rate": failures.height / judgments.height if judgments.height else 0.0,
                           "examples": failures["error"].head(3).to_list()},
        "scores": {column: score_distribution(ok[column]) for column in [*criteria, "overall"]},
        "first_speakers": first_speaker_scores(episodes, judgments, aggregation, clusters),
        "pairs": pairs_summary(pairs, n_states),
        "request_cache": cache,
    }


def wandb_metrics(summary: dict[str, Any], pairs: pl.DataFrame) -> dict[str, Any]:
    metrics: dict[str, Any] = {f"count/{k}": v for k, v in summary["counts"].items()}
    directives = summary["directives"]
    metrics["directives/fallbacks"] = directives["fallbacks"]
    if directives["valid"]["n"]:
        metrics["directives/valid"] = directives["valid"]["value"]
    for name, dist in summary["scores"].items():
        if dist["n"]:
            metrics[f"score_mean/{name}"] = dist["mean"]
    if pairs.height:
        metrics["margin"] = Histogram(values=pairs["margin"].to_list())
    if "group_rm" in summary:
        metrics["group_rm/held_out_accuracy"] = summary["group_rm"]["held_out"]["accuracy"]["value"]
    if "director_eval" in summary:
        for name, score in summary["director_eval"]["scores"].items():
            metrics[f"director_eval/{name}_difference"] = score["difference"]["mean"]
        for policy, share in summary["director_eval"]["validity"].items():
            metrics[f"director_eval/validity_{policy}"] = share["value"]
        for name in ("rollout_sd", "unshared_sd", "directive_sd"):
            if (value := summary["director_eval"]["signal"][name]) is not None:
                metrics[f"director_eval/{name}"] = value
    return metrics


def stage2_markdown(summary: dict[str, Any]) -> str:
    counts, directives, cache = summary["counts"], summary["directives"], summary["request_cache"]
    lines = ["# Stage 2", "", "## Episodes", "", "| | count |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in counts.items()]
    lines += ["", "## Directives in the episodes", "",
              (f"Valid directives (no fallback): {clustered_interval(directives['valid'])}; valid at the first "
              f"attempt: {clustered_interval(directives['valid_first_attempt'])}. 95% bootstrap intervals over episodes."),
              (f"Fallbacks (a seeded random persona, after every attempt failed): {directives['fallbacks']} of "
              f"{directives['turns']} companion turns."),
              "Attempts per turn: " + ", ".join(f"{k}: {v}" for k, v in directives["attempts"].items()) + ".",
              "Turns per speaker: " + ", ".join(f"{k}: {v}" for k, v in directives["speakers"].items()) + ".",
              "", "## Group judge", "",
              (f"Judge failures: {summary['judge_failures']['rate']:.1%} of judgments. "
              f"Request cache: {cache.get('hits', 0)} hits, {cache.get('misses', 0)} misses this run."),
              "", "| score | n | mean | sd |", "|---|---|---|---|"]
    lines += [f"| {name} | {d['n']} | {d['mean']:.2f} | {d['sd']:.2f} |" for name, d in summary["scores"].items() if d["n"]]
    if summary.get("first_speakers"):
        lines += ["", ("The first choice, as the judge scores it: each trajectory's overall score less its state's "
                       "mean, by who spoke first in it (95% bootstrap interval over clusters): "
                       + ", ".join(f"{speaker} {signed_interval(d)} (n={d['n']})"
                                   for speaker, d in summary["first_speakers"].items())
                       + ". Where every interval holds 0, the judge gives the Director's first choice nothing to learn.")]
    lines += ["", (f"Trajectory pairs: {summary['pairs']['count']} from {summary['pairs']['queries_with_pairs']} of "
                  f"{summary['pairs']['n_queries']} states; directive pairs (both first directives written by the "
                  f"Director, and different): {counts['directive_pairs']}.")]
    if "group_rm" in summary:
        lines += ["", *reward_model_markdown(summary["group_rm"], "Group reward model",
                                             "first speaker of the chosen branch")]
    if "director" in summary:
        lines += ["", *director_markdown(summary["director"], summary["director_method"])]
    if "director_eval" in summary:
        lines += ["", *director_eval_markdown(summary["director_eval"])]
    return "\n".join(lines) + "\n"


def signed_interval(d: dict[str, Any]) -> str:
    """'+0.127 [+0.050, +0.201]' for a `clustered_mean` of differences ('[no interval]' from one cluster)."""
    interval = "[no interval]" if d["ci_low"] is None else f"[{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"
    return f"{d['value']:+.3f} {interval}"


def director_markdown(metrics: dict[str, Any], method: str) -> list[str]:
    parameters, training = metrics["trainable_parameters"], metrics["training"]
    what = ("GRPO against the group reward model (the paper's method)" if method == "grpo"
            else "DPO over directive pairs (an alternative, not the paper's method)")
    units = f"{training['prompts']} states" if "prompts" in training else f"{training['pairs']} directive pairs"
    lines = ["## Director", "", (f"Trained with {what}. LoRA: {parameters['trainable']:,} of {parameters['total']:,} "
             f"parameters trainable ({parameters['fraction']:.3%}); {training['steps']} steps on {units}.")]
    if method == "dpo":
        lines.append(f"Mode `{training['mode']}`: its directive pairs are the first directives of trajectory pairs "
                     f"whose trajectories run {training['trajectory_blocks']} block(s) from their state.")
    elif training["mode"] == "trajectory":
        lines.append(f"Mode `trajectory`: each sampled directive opens a trajectory of {training['trajectory_blocks']} "
                     "block(s) to the episode's end, in which the policy being trained makes every directive; the "
                     "reward is the group reward model's score of the whole trajectory.")
    else:
        lines.append("Mode `block`: each sampled directive opens one block, which the base Director plays to its end; "
                     "the reward is the group reward model's score of that block.")
    return lines


def director_eval_markdown(metrics: dict[str, Any]) -> list[str]:
    lines = ["## The Director before and after training, on held-out states", "",
             (f"{metrics['states']} held-out states of {metrics['contexts']} held-out contexts, "
             f"{metrics['samples_per_prompt']} directive(s) per state and policy, same seeds for both. Each directive "
             "is read as written (an invalid one becomes the fallback), rolled out as in training (in `trajectory` "
             f"mode with the same policy making every later directive) {metrics['signal']['rollouts']} time(s) with "
             "different seeds, and scored as in training, with the group reward model's term averaged over its "
             "rollouts."), "",
             "| score | states | clusters | base mean ± sd | trained mean ± sd | difference [95% CI over clusters] |",
             "|---|---|---|---|---|---|"]
    for name, score in metrics["scores"].items():
        base, trained, by_context = score["base"], score["director"], score["by_context"]
        if not by_context["n"]:
            lines.append(f"| {name} | 0 | 0 | n/a | n/a | n/a |")
            continue
        lines.append(f"| {name} | {by_context['n']} | {by_context['clusters']} | {base['mean']:.3f} ± {base['sd']:.3f} "
                     f"| {trained['mean']:.3f} ± {trained['sd']:.3f} | {signed_interval(by_context)} |")
    validity, fallbacks = metrics["validity"], metrics["fallbacks"]
    lines += ["", ("Differences are trained - base, averaged per state; intervals are percentile bootstraps that "
                   "resample the held-out contexts' clusters, the unit of independence (a context's states share its "
                   "conversation, a meeting's windows its meeting)."),
              (f"Directive validity (first directive): base {clustered_interval(validity['base'])}, trained "
              f"{clustered_interval(validity['director'])} (bootstrap over clusters); fallbacks: base "
              f"{fallbacks['base']}, trained {fallbacks['director']}.")]
    return [*lines, *reward_signal_lines(metrics["signal"])]


def reward_signal_lines(signal: dict) -> list[str]:
    """The report's lines on the reward signal (`director_eval.reward_signal`), where there are rollouts to split."""
    if signal["rollout_sd"] is None:
        return []
    if signal["directive_sd"] is None:
        return ["", (f"Reward signal: the group reward model's score of one directive's rollouts varies by sd "
                     f"{signal['rollout_sd']:.3f}; no held-out state has two distinct valid directives, so the "
                     f"spread between directives, which is what a Director can change, is undefined "
                     f"({signal['directives']} distinct valid directives of {signal['states']} states).")]
    interval = ("[no interval: one cluster]" if signal["directive_sd_ci"] is None
                else "[{:.3f}, {:.3f}]".format(*signal["directive_sd_ci"]))
    return ["", (f"Reward signal: the group reward model's score of one directive's rollouts varies by sd "
                 f"{signal['rollout_sd']:.3f} (the sampling of the rest of the trajectory), of which sd "
                 f"{signal['unshared_sd']:.3f} does not cancel between the directives of a state (their rollouts "
                 f"share seeds); the distinct valid directives of one state differ by sd "
                 f"{signal['directive_sd']:.3f} {interval} beyond that noise (bootstrap over clusters; the upper "
                 f"end bounds it), which is what a Director can change ({signal['directives']} directives of "
                 f"{signal['states']} states, {signal['rollouts']} rollouts each).")]

