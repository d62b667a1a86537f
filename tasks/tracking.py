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
from mascot.judges.panel import Aggregation
from mascot.llm import shared_cache
from mascot.rubrics import Rubric
from mascot.stage1 import report
from mascot.stage2 import report as stage2_report
from tasks.caching import CACHED, keyed
from tasks.failures import REPORTED


@task(**CACHED, **REPORTED)
def report_stage1(run_name: str, rubric: Rubric, artifacts: dict[str, Artifact], requests: Path,
                  out: Path, partial: str | None = None) -> dict[str, Artifact]:
    """`partial`: the last step of a partial rerun of a run whose report went further. Its Prefect artifacts
    then have keys of their own, so the latest version of the run's keys stays the finished report's."""
    stats = shared_cache(requests).stats().as_dict()
    summary, written = report.write_report(rubric, artifacts, stats, keyed(out), partial)
    key = f"{run_name}-stage1{f'-until-{partial}' if partial else ''}".lower().replace("_", "-").replace(".", "-")
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


@task(**CACHED, **REPORTED)
def report_stage2(run_name: str, rubric: Rubric, aggregation: Aggregation, method: str, artifacts: dict[str, Artifact], contexts: Artifact,
                  requests: Path, out: Path) -> dict[str, Artifact]:
    stats = shared_cache(requests).stats().as_dict()
    summary, written = stage2_report.write_report(rubric, aggregation, method, artifacts, contexts, stats, keyed(out))
    key = f"{run_name}-stage2".lower().replace("_", "-").replace(".", "-")
    if "group_rm" in summary:
        held_out = summary["group_rm"]["held_out"]
        create_table_artifact(key=f"{key}-group-rm-accuracy", description="Held-out pair accuracy (bootstrap over "
                              "contexts first, then Wilson over pairs)",
                              table=[{"interval": "by context", **held_out["accuracy_by_context"]},
                                     {"interval": "Wilson", **held_out["accuracy"]}])
    create_markdown_artifact(key=f"{key}-summary", markdown=written["stage2/report"].path.read_text(),
                             description=f"Stage 2 report of run {run_name}")
    return written
