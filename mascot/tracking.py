"""What a Stage 1 run reports: counts, score distributions, pair statistics, failures, cache use.

`stage1_summary` computes it from the artifacts; `log_to_wandb` sends it to one wandb run
(offline in the tiny profile). The flow also publishes it as Prefect artifacts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from mascot.config import RunConfig, TrackingConfig
from mascot.judges.panel import agreement
from mascot.judges.rubrics import Rubric
from mascot.pairs import pairs_summary


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
            column: _distribution(ok[column]) for column in [*criteria, "overall"]
        },
        "scores_by_persona": by_persona.to_dicts(),
        "pairs": pairs_summary(pairs, n_queries),
        "agreement": agreement(judgments),
        "request_cache": cache,
    }


def _distribution(values: pl.Series) -> dict[str, Any]:
    array = values.drop_nulls().to_numpy()
    if array.size == 0:
        return {"n": 0, "mean": None, "sd": None, "histogram": {"edges": [], "counts": []}}
    counts, edges = np.histogram(array, bins=np.arange(0.75, 5.5, 0.5))
    return {"n": int(array.size), "mean": float(array.mean()), "sd": float(array.std(ddof=1)) if array.size > 1 else 0.0,
            "histogram": {"edges": edges.tolist(), "counts": counts.tolist()}}


def log_to_wandb(config: RunConfig, job: str, summary: dict[str, Any], pairs: pl.DataFrame) -> str | None:
    """Log the summary to one wandb run; returns its folder, or None when tracking is disabled."""
    tracking: TrackingConfig = config.tracking
    if tracking.wandb_mode == "disabled":
        return None
    try:
        import wandb
    except ImportError as exc:
        raise ImportError("tracking.wandb_mode is not 'disabled' but wandb is not installed: "
                          "pip install 'mascot[wandb]', or set tracking.wandb_mode: disabled") from exc
    config.run_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=tracking.wandb_project, mode=tracking.wandb_mode, dir=str(config.run_dir),
                     name=f"{config.run.name}-{job}", group=config.run.name, job_type=job,
                     config=config.model_dump(mode="json"))  # holds env-var names, never secret values
    try:
        flat = {f"{job}/count/{k}": v for k, v in summary["counts"].items()}
        flat[f"{job}/judge_failure_rate"] = summary["judge_failures"]["rate"]
        for name, dist in summary["scores"].items():
            if dist["n"]:
                flat[f"{job}/score_mean/{name}"] = dist["mean"]
                histogram = dist["histogram"]
                flat[f"{job}/score/{name}"] = wandb.Histogram(np_histogram=(histogram["counts"], histogram["edges"]))
        flat.update({f"{job}/request_cache/{k}": v for k, v in summary["request_cache"].items()})
        flat[f"{job}/pairs_per_query_mean"] = summary["pairs"]["pairs_per_query_mean"]
        if pairs.height:
            flat[f"{job}/margin"] = wandb.Histogram(pairs["margin"].to_numpy())
            flat[f"{job}/pairs_per_query"] = wandb.Histogram(pairs.group_by("query_id").len()["len"].to_numpy())
        rows = summary["scores_by_persona"]
        if rows:
            flat[f"{job}/scores_by_persona"] = wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
        run.log(flat)
        return run.dir
    finally:
        run.finish()


def stage1_markdown(summary: dict[str, Any]) -> str:
    counts, failures, cache = summary["counts"], summary["judge_failures"], summary["request_cache"]
    lines = ["# Stage 1 data", "", "| | count |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in counts.items()]
    by_judge = ", ".join(f"{judge}: {n}" for judge, n in failures["by_judge"].items()) or "none"
    lines += ["",
              f"Judge failures: {failures['rate']:.1%} of judgments ({by_judge}).",
              f"Request cache: {cache.get('hits', 0)} hits, {cache.get('misses', 0)} misses this run.",
              "", "| score | n | mean | sd |", "|---|---|---|---|"]
    for name, dist in summary["scores"].items():
        if dist["n"]:
            lines.append(f"| {name} | {dist['n']} | {dist['mean']:.2f} | {dist['sd']:.2f} |")
    return "\n".join(lines) + "\n"
