"""What a Stage 1 run reports: counts, score distributions, pair statistics, failures, cache use,
and the training metrics of the persona reward model, the Speaker and the before/after comparison.

`write_report` computes the summary from the artifacts and writes summary.json, report.md and
reward_curve.png; `wandb_metrics` says what of it goes to wandb. The flow also publishes it as
Prefect artifacts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mascot.artifacts import STAGE_REPORT_FROM_PARTIAL, Artifact, write_json, write_text
from mascot.evaluation.plots import reward_curve
from mascot.evaluation.report import counted
from mascot.judges.panel import agreement
from mascot.rubrics import Rubric
from mascot.stage1.pairs import pairs_summary
from mascot.tracking import Histogram, log_metrics

# Training artifacts whose metrics.json joins the summary, by the summary key they go under.
TRAINING_METRICS = {"persona_rm": "stage1/persona_rm", "speaker": "stage1/speaker", "before_after": "stage1/speaker_eval"}


def write_report(rubric: Rubric, artifacts: dict[str, Artifact], cache: dict[str, float],
                 out: Path, partial: str | None = None) -> tuple[dict[str, Any], dict[str, Artifact]]:
    """The summary of a run's Stage 1 artifacts, written to the folder `out` as summary.json,
    report.md and, once the Speaker is trained, reward_curve.png, and logged to the active wandb run.
    Returns the summary and the files.

    `partial` is the last step of a partial rerun (`--until pairs`) of a run whose report already went
    further: the report says so, and links that report."""
    frames = {name: artifacts[f"stage1/{name}"].read_parquet()
              for name in ("contexts", "candidates", "judgments", "pairs")}
    summary = stage1_summary(rubric, frames["contexts"], frames["candidates"], frames["judgments"],
                             frames["pairs"], cache)
    if partial is not None:
        summary["partial_run"] = {"until": partial, "full_report": "stage1/report.md"}
    for key, name in TRAINING_METRICS.items():
        if name in artifacts:
            summary[key] = json.loads((artifacts[name].verified() / "metrics.json").read_text())
    written = {"stage1/summary": write_json(summary, out / "summary.json")}
    if "speaker" in summary:
        written["stage1/reward_curve"] = reward_curve(summary["speaker"]["log_history"],
                                                      summary["speaker"]["reward_names"], out / "reward_curve.png")
    written["stage1/report"] = write_text(stage1_markdown(summary), out / "report.md")
    log_metrics("stage1", wandb_metrics(summary, frames["pairs"]))
    return summary, written


def stage1_summary(rubric: Rubric, contexts: pl.DataFrame, candidates: pl.DataFrame, judgments: pl.DataFrame,
                   pairs: pl.DataFrame, cache: dict[str, float]) -> dict[str, Any]:
    criteria = rubric.criterion_ids
    ok = judgments.filter(pl.col("ok"))
    failures = judgments.filter(~pl.col("ok"))
    n_queries = candidates["query_id"].n_unique()
    by_persona = (
        ok.join(candidates.select("query_id", "candidate_idx", "persona"), on=["query_id", "candidate_idx"])
        .group_by("persona").agg(*[pl.col(c).mean() for c in [*criteria, "overall"]], pl.len().alias("n"))
        .sort("persona")
    )
    return {
        "counts": {
            "contexts": contexts.height, "queries": n_queries, "candidates": candidates.height,
            "judgments": judgments.height, "judge_failures": failures.height, "pairs": pairs.height,
        },
        "judge_failures": {
            "rate": failures.height / judgments.height if judgments.height else 0.0,
            "by_judge": dict(failures.group_by("judge").len().sort("judge").iter_rows()),
            "examples": failures["error"].head(3).to_list(),
        },
        "scores": {
            column: score_distribution(ok[column]) for column in [*criteria, "overall"]
        },
        "scores_by_persona": by_persona.to_dicts(),
        "pairs": pairs_summary(pairs, n_queries),
        "agreement": agreement(judgments),
        "request_cache": cache,
    }


def score_distribution(values: pl.Series) -> dict[str, Any]:
    array = values.drop_nulls().to_numpy()
    if array.size == 0:
        return {"n": 0, "mean": None, "sd": None, "histogram": {"edges": [], "counts": []}}
    counts, edges = np.histogram(array, bins=np.arange(0.75, 5.5, 0.5))
    return {"n": int(array.size), "mean": float(array.mean()), "sd": float(array.std(ddof=1)) if array.size > 1 else 0.0,
            "histogram": {"edges": edges.tolist(), "counts": counts.tolist()}}


def wandb_metrics(summary: dict[str, Any], pairs: pl.DataFrame) -> dict[str, Any]:
    """What of a summary goes to wandb (`mascot.tracking.log_metrics`)."""
    metrics: dict[str, Any] = {f"count/{k}": v for k, v in summary["counts"].items()}
    metrics["judge_failure_rate"] = summary["judge_failures"]["rate"]
    for name, dist in summary["scores"].items():
        if dist["n"]:
            metrics[f"score_mean/{name}"] = dist["mean"]
            metrics[f"score/{name}"] = Histogram(counts=dist["histogram"]["counts"], edges=dist["histogram"]["edges"])
    metrics.update({f"request_cache/{k}": v for k, v in summary["request_cache"].items()})
    metrics["pairs_per_query_mean"] = summary["pairs"]["pairs_per_query_mean"]
    if pairs.height:
        metrics["margin"] = Histogram(values=pairs["margin"].to_list())
        metrics["pairs_per_query"] = Histogram(values=pairs.group_by("query_id").len()["len"].to_list())
    if summary["scores_by_persona"]:
        metrics["scores_by_persona"] = summary["scores_by_persona"]
    if "persona_rm" in summary:
        metrics["persona_rm/held_out_accuracy"] = summary["persona_rm"]["held_out"]["accuracy"]["value"]
        if "persona_swap" in summary["persona_rm"]["held_out"]:
            metrics["persona_rm/persona_swap_accuracy"] = summary["persona_rm"]["held_out"]["persona_swap"]["accuracy"]["value"]
    if "before_after" in summary:
        metrics["before_after"] = before_after_rows(summary["before_after"])
        for name, score in summary["before_after"]["scores"].items():
            metrics[f"before_after/{name}_difference"] = score["difference"]["mean"]
    return metrics


def before_after_rows(before_after: dict[str, Any]) -> list[dict[str, Any]]:
    """The before/after table: one row per score, each number with its n and interval."""
    rows = []
    for name, score in before_after["scores"].items():
        base, speaker, difference = score["base"], score["speaker"], score["difference"]
        by_context = score.get("difference_by_context", {})
        rows.append({"score": name, "n": difference["n"], "contexts": by_context.get("clusters"),
                     "base_mean": base["mean"], "base_sd": base["sd"],
                     "speaker_mean": speaker["mean"], "speaker_sd": speaker["sd"],
                     "difference": difference["mean"], "ci_low": by_context.get("ci_low"),
                     "ci_high": by_context.get("ci_high"), "ci_low_bca": difference["ci_low"],
                     "ci_high_bca": difference["ci_high"]})
    return rows


def stage1_markdown(summary: dict[str, Any]) -> str:
    counts, failures, cache = summary["counts"], summary["judge_failures"], summary["request_cache"]
    lines = ["# Stage 1", ""]
    if "partial_run" in summary:
        until = summary["partial_run"]["until"]
        note = (f"> A partial run, `--until {until}`: this report describes the steps up to {until} only. The "
                f"run's report, from a run that went further, is [stage1/report.md]({STAGE_REPORT_FROM_PARTIAL}).")
        lines += [note, ""]
    lines += ["## Data", "", "| | count |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in counts.items()]
    by_judge = ", ".join(f"{judge}: {n}" for judge, n in failures["by_judge"].items()) or "none"
    lines += ["",
              f"Judge failures: {failures['rate']:.1%} of judgments ({by_judge}).",
              f"Request cache: {cache.get('hits', 0)} hits, {cache.get('misses', 0)} misses this run.",
              "", "| score | n | mean | sd |", "|---|---|---|---|"]
    for name, dist in summary["scores"].items():
        if dist["n"]:
            lines.append(f"| {name} | {dist['n']} | {dist['mean']:.2f} | {dist['sd']:.2f} |")
    if "persona_rm" in summary:
        lines += ["", *reward_model_markdown(summary["persona_rm"])]
    if "speaker" in summary:
        lines += ["", *speaker_markdown(summary["speaker"])]
    if "before_after" in summary:
        lines += ["", *before_after_markdown(summary["before_after"])]
    return "\n".join(lines) + "\n"


def _interval(share: dict[str, Any]) -> str:
    if share["n"] == 0:
        return "n/a (n=0)"
    return f"{share['value']:.1%} [{share['ci_low']:.1%}, {share['ci_high']:.1%}] (n={share['n']})"


def clustered_interval(share: dict[str, Any]) -> str:
    if not share["n"]:
        return "n/a (n=0)"
    interval = "[no interval]" if share["ci_low"] is None else f"[{share['ci_low']:.1%}, {share['ci_high']:.1%}]"
    return f"{share['value']:.1%} {interval} (n={share['n']} from {counted(share['clusters'], 'cluster')})"


def accuracy_lines(held_out: dict[str, Any]) -> list[str]:
    """Held-out pair accuracy, with the interval that resamples clusters first: pairs of one context, and the windows
    of one meeting, are not independent, so the Wilson interval over pairs is too narrow, and is shown second."""
    return [(f"Held-out pair accuracy: {clustered_interval(held_out['accuracy_by_context'])}, 95% bootstrap interval "
            "over clusters (a context, or a meeting's windows); chance is 50%."),
            f"Wilson 95% interval over pairs, as if they were independent: {_interval(held_out['accuracy'])}."]


def _sampled(train: dict[str, Any]) -> str:
    """Say when the training-pair accuracy was measured on a sample (`accuracy_sample_pairs`); older runs scored all."""
    if "pairs_scored" not in train or train["pairs_scored"] == train["pairs"]:
        return ""
    return f", on a seeded sample of {train['pairs_scored']} of the {train['pairs']} training pairs"


def reward_model_markdown(metrics: dict[str, Any], title: str = "Persona reward model",
                          group: str = "persona") -> list[str]:
    held_out, training = metrics["held_out"], metrics["training"]
    margin = held_out["margin"]
    lines = [f"## {title}", "", *accuracy_lines(held_out), "",
             f"Training-pair accuracy: {_interval(metrics['train']['accuracy'])}{_sampled(metrics['train'])}.", "",
             f"| {group} | held-out accuracy [95% Wilson CI] (n) |", "|---|---|"]
    lines += [f"| {persona} | {_interval(share)} |" for persona, share in held_out["by_persona"].items()]
    if "persona_swap" in held_out:
        lines += ["", *persona_swap_lines(held_out["persona_swap"])]
    if margin["n"]:
        lines += ["", (f"Held-out reward margin (chosen - rejected): mean {margin['mean']:.3f}, sd {margin['sd']:.3f}, "
                      f"median {margin['median']:.3f}, n={margin['n']}.")]
    lines += ["", (f"Trained {training['steps']} steps on {training['train_pairs']} pairs; "
                  f"{training['held_out_pairs']} pairs of {len(training['held_out_contexts'])} held-out contexts."
                  f"{_dropped(training)}")]
    return lines


def _dropped(training: dict[str, Any]) -> str:
    """The training pairs the trainer dropped for their length, where it dropped any (older runs did not count)."""
    kept = training.get("train_pairs_within_max_length", training["train_pairs"])
    if kept == training["train_pairs"]:
        return ""
    dropped = training["train_pairs"] - kept
    limit = f" ({training['max_length']} tokens)" if "max_length" in training else ""
    return (f" **{dropped} of the {training['train_pairs']} training pairs ({dropped / training['train_pairs']:.1%}) "
            f"were longer than max_length{limit} and left out: the model learned from {kept}.**")


def persona_swap_lines(swap: dict[str, Any]) -> list[str]:
    """The persona-swap test (`mascot.stage1.persona_swap`): its share with the Wilson interval over comparisons,
    and the interval that resamples contexts."""
    accuracy = swap["accuracy"]
    if not accuracy["n"]:
        return ["Persona-swap accuracy: n/a (n=0): no held-out context has pairs under two personas."]
    by_persona = ", ".join(f"{persona} {_interval(share)}" for persona, share in swap["by_persona"].items())
    return [(f"Persona-swap accuracy: {_interval(accuracy)}, 95% Wilson interval over comparisons: of "
             f"{swap['replies']} held-out chosen replies, each scored under its own persona's prompt and under each "
             "other persona's prompt of the same context, the share where its own persona scores higher; chance is "
             f"50%. 95% bootstrap interval over clusters: {clustered_interval(swap['accuracy_by_context'])}."),
            f"By persona: {by_persona}."]


def speaker_markdown(metrics: dict[str, Any]) -> list[str]:
    parameters, training, history = metrics["trainable_parameters"], metrics["training"], metrics["log_history"]
    lines = ["## GRPO Speaker", "",
             f"LoRA: {parameters['trainable']:,} of {parameters['total']:,} parameters trainable "
             f"({parameters['fraction']:.3%}). {training['steps']} steps on {training['prompts']} prompts"
             + (f", resumed from step {training['resumed_from_step']}." if training["resumed_from_step"] else ".")]
    if history:
        # Each step sees a few prompts only, so single steps are noise: compare the first and last tenth.
        window = max(1, len(history) // 10)
        first, last = history[:window], history[-window:]
        lines += ["", (f"Weighted reward, mean over steps {first[0]['step']}-{first[-1]['step']}: "
                       f"{np.mean([e['reward'] for e in first]):.3f}; over steps {last[0]['step']}-{last[-1]['step']}: "
                       f"{np.mean([e['reward'] for e in last]):.3f} (see reward_curve.png). The held-out comparison "
                       "below is the measurement; this is the training signal.")]
    return lines


def before_after_markdown(metrics: dict[str, Any]) -> list[str]:
    lines = ["## Before and after GRPO, on held-out prompts", "",
             (f"{metrics['prompts']} held-out prompts, {metrics['samples_per_prompt']} sample(s) per prompt and policy, "
             f"same seeds for both; judge failures: {metrics['judge_failures']}."), "",
             ("| score | n (clusters) | base mean ± sd | Speaker mean ± sd | difference [95% CI over clusters] "
             "| [95% CI over prompts] |"), "|---|---|---|---|---|---|"]
    for row in before_after_rows(metrics):
        if row["n"] == 0:
            lines.append(f"| {row['score']} | 0 | n/a | n/a | n/a | n/a |")
            continue
        over_contexts = "n/a" if row["ci_low"] is None else f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"
        lines.append(f"| {row['score']} | {row['n']} ({row['contexts']}) | {row['base_mean']:.3f} ± {row['base_sd']:.3f} | "
                     f"{row['speaker_mean']:.3f} ± {row['speaker_sd']:.3f} | {row['difference']:+.3f} {over_contexts} | "
                     f"[{row['ci_low_bca']:+.3f}, {row['ci_high_bca']:+.3f}] |")
    lines += ["", ("Differences are Speaker - base, averaged per prompt. The first interval resamples contexts (the "
              "personas' prompts of one context are not independent); the second is the paired bootstrap (BCa) "
              "over prompts, as if they were.")]
    return lines
