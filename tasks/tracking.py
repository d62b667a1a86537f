"""Reporting tasks: the run summary as a JSON artifact, a wandb run and Prefect artifacts."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from mascot import stage1, tracking
from mascot.artifacts import Artifact, RunDir, write_json
from mascot.config import RunConfig
from mascot.judges.rubrics import Rubric


@task
def publish_stage1_summary(config: RunConfig, rubric: Rubric, artifacts: dict[str, Artifact], cache_path: Path) -> dict:
    frames = {name.split("/")[-1]: artifact.read_parquet() for name, artifact in artifacts.items()}
    summary = tracking.stage1_summary(rubric, frames["contexts"], frames["candidates"], frames["judgments"],
                                      frames["pairs"], stage1.cache_stats(cache_path))
    run = RunDir(config.run_dir)
    run.record({"stage1/summary": write_json(summary, run.stage1("summary.json"))})
    tracking.log_to_wandb(config, "stage1", summary, frames["pairs"])
    key = f"{config.run.name}-stage1".lower().replace("_", "-").replace(".", "-")
    create_table_artifact(key=f"{key}-scores", table=summary["scores_by_persona"],
                          description="Mean judge scores per persona (successful judgments only)")
    create_markdown_artifact(key=f"{key}-summary", markdown=tracking.stage1_markdown(summary),
                             description=f"Stage 1 data summary of run {config.run.name}")
    return summary
