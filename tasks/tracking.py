"""Reporting tasks: the run's summary and report (files and wandb), published as Prefect artifacts.

The report is cached like the steps it reports on: a rerun that changed nothing writes, logs and
publishes nothing new.
"""

from __future__ import annotations

import base64
from pathlib import Path

from prefect import task
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact

from mascot.artifacts import Artifact
from mascot.llm import shared_cache
from mascot.rubrics import Rubric
from mascot.stage1 import report
from tasks.caching import CACHED, keyed
from tasks.failures import REPORTED


@task(**CACHED, **REPORTED)
def report_stage1(run_name: str, rubric: Rubric, artifacts: dict[str, Artifact], requests: Path,
                  out: Path) -> dict[str, Artifact]:
    stats = shared_cache(requests).stats().as_dict()
    summary, written = report.write_report(rubric, artifacts, stats, keyed(out))
    key = f"{run_name}-stage1".lower().replace("_", "-").replace(".", "-")
    if "stage1/reward_curve" in written:
        curve = written["stage1/reward_curve"].path
        png = base64.b64encode(curve.read_bytes()).decode()
        create_image_artifact(image_url=f"data:image/png;base64,{png}", key=f"{key}-reward-curve",
                              description=f"GRPO reward per step ({curve})")
    create_table_artifact(key=f"{key}-scores", table=summary["scores_by_persona"],
                          description="Mean judge scores per persona (successful judgments only)")
    if "persona_rm" in summary:
        held_out = summary["persona_rm"]["held_out"]
        create_table_artifact(key=f"{key}-persona-rm-accuracy", description="Held-out pair accuracy, Wilson 95% CI",
                              table=[{"persona": persona, **share} for persona, share in
                                     [("all", held_out["accuracy"]), *held_out["by_persona"].items()]])
    if "before_after" in summary:
        create_table_artifact(key=f"{key}-before-after", table=report.before_after_rows(summary["before_after"]),
                              description="Base policy vs trained Speaker on held-out prompts (paired bootstrap)")
    create_markdown_artifact(key=f"{key}-summary", markdown=written["stage1/report"].path.read_text(),
                             description=f"Stage 1 report of run {run_name}")
    return written
