"""Reporting tasks: the run summary and report, the flow's wandb run, and Prefect artifacts."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from prefect import task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact

from mascot import stage1, tracking
from mascot.artifacts import Artifact, RunDir, write_json, write_text
from mascot.config import RunConfig
from mascot.evaluation.plots import reward_curve
from mascot.judges.rubrics import Rubric

TRAINING_METRICS = {"persona_rm": "stage1/persona_rm", "speaker": "stage1/speaker", "before_after": "stage1/speaker_eval"}


@task
def publish_stage1_summary(config: RunConfig, rubric: Rubric, artifacts: dict[str, Artifact], cache_path: Path) -> dict:
    frames = {name.split("/")[-1]: artifacts[name].read_parquet()
              for name in ("stage1/contexts", "stage1/candidates", "stage1/judgments", "stage1/pairs")}
    summary = tracking.stage1_summary(rubric, frames["contexts"], frames["candidates"], frames["judgments"],
                                      frames["pairs"], stage1.cache_stats(cache_path))
    for key, name in TRAINING_METRICS.items():
        if name in artifacts:
            summary[key] = json.loads((artifacts[name].verified() / "metrics.json").read_text())
    run = RunDir(config.run_dir)
    written = {"stage1/summary": write_json(summary, run.stage1("summary.json"))}
    key = f"{config.run.name}-stage1".lower().replace("_", "-").replace(".", "-")
    if "speaker" in summary:
        curve = reward_curve(summary["speaker"]["log_history"], summary["speaker"]["reward_names"],
                             run.stage1("reward_curve.png"))
        written["stage1/reward_curve"] = curve
        png = base64.b64encode(curve.path.read_bytes()).decode()
        create_image_artifact(image_url=f"data:image/png;base64,{png}", key=f"{key}-reward-curve",
                              description=f"GRPO reward per step ({curve.path})")
    report = tracking.stage1_markdown(summary)
    written["stage1/report"] = write_text(report, run.stage1("report.md"))
    run.record(written)
    tracking.log_to_wandb("stage1", summary, frames["pairs"])
    create_table_artifact(key=f"{key}-scores", table=summary["scores_by_persona"],
                          description="Mean judge scores per persona (successful judgments only)")
    if "persona_rm" in summary:
        held_out = summary["persona_rm"]["held_out"]
        create_table_artifact(key=f"{key}-persona-rm-accuracy", description="Held-out pair accuracy, Wilson 95% CI",
                              table=[{"persona": persona, **share} for persona, share in
                                     [("all", held_out["accuracy"]), *held_out["by_persona"].items()]])
    if "before_after" in summary:
        create_table_artifact(key=f"{key}-before-after", table=tracking.before_after_rows(summary["before_after"]),
                              description="Base policy vs trained Speaker on held-out prompts (paired bootstrap)")
    create_markdown_artifact(key=f"{key}-summary", markdown=report, description=f"Stage 1 report of run {config.run.name}")
    return summary
