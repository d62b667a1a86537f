"""`mascot run <stage>`: a pipeline stage as a Prefect flow, cached and resumable."""

from __future__ import annotations

import os
from enum import Enum
from typing import Annotated

import typer
from pydantic import ValidationError

from cli.common import ConfigOption, console, fail, load
from mascot.redaction import redact_url

run_app = typer.Typer(help="Run pipeline stages as Prefect flows (cached and resumable).", no_args_is_help=True)

# Prefect's embedded server needs longer than its default to start on a small machine.
PREFECT_DEFAULTS = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


class Stage1Step(str, Enum):
    pairs = "pairs"
    persona_rm = "persona_rm"
    speaker = "speaker"


@run_app.command("stage1")
def run_stage1(
    config: ConfigOption,
    run_name: Annotated[str | None, typer.Option(help="Override run.name (the run directory's name).")] = None,
    until: Annotated[Stage1Step, typer.Option(
        help="Last step: 'pairs' (data only), 'persona_rm' (+ reward model) or 'speaker' (+ GRPO and the "
             "before/after comparison).")] = Stage1Step.speaker,
    refresh: Annotated[bool, typer.Option(
        help="Recompute every step instead of reusing cached results. LLM requests are still answered by "
             "the request cache; training runs again.")] = False,
):
    """Stage 1: candidates, judgments and preference pairs; the persona reward model; the GRPO Speaker.

    Reruns skip every cached step; a killed run resumes where it stopped, training from its last
    checkpoint. Artifacts go to <run.output_dir>/<run name>/stage1/, with report.md and summary.json.

    The flow reports to the Prefect server at PREFECT_API_URL when it is set (keep one running with
    `prefect server start --background`), else to a temporary one started for this run.
    """
    # Fail fast, before Prefect starts, on a bad config, a bad run name, or (when training) this machine.
    loaded = load(config, check_machine=until is not Stage1Step.pairs)
    if run_name is not None:
        try:
            loaded.renamed(run_name)
        except ValidationError as exc:
            fail(f"--run-name {run_name!r}: {exc.errors()[0]['msg'].replace('String should', 'should')}")
    announce_prefect_server()
    from flows.stage1 import stage1
    from mascot.artifacts import ArtifactChanged, unkeyed_path
    from mascot.judges.panel import JudgeFailureRateExceeded
    from mascot.llm import BackendError
    from mascot.train.runtime import TrainingSetupError

    try:
        artifacts = stage1(str(config), run_name=run_name, until=until.value, refresh=refresh)
    except (JudgeFailureRateExceeded, BackendError, TrainingSetupError, ArtifactChanged) as exc:
        # Everything finished before the failure is cached: rerunning resumes from there.
        fail(f"stage 1 stopped: {exc}", code=1)
    run_dir = artifacts["stage1/contexts"].path.parents[1]  # where the flow put the run, --run-name included
    console.print(f"[green]stage 1 done[/green] (until {until.value}): {run_dir}", highlight=False)
    for name, artifact in artifacts.items():
        console.print(f"  {name:<20} {unkeyed_path(artifact.path)}", highlight=False, soft_wrap=True)


def announce_prefect_server() -> None:
    """Say, once, which Prefect server the flow will use; fail now if the configured one does not answer."""
    for name, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import httpx
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        console.print("Prefect server: a temporary one, started for this run (a few seconds; keep one running "
                      "and set PREFECT_API_URL to skip that, see `mascot run stage1 --help`)", highlight=False)
        return
    shown = redact_url(url)
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        fail(f"PREFECT_API_URL is {shown}, but no Prefect server answers there ({type(exc).__name__}). Start "
             "one with `prefect server start --background`, or unset PREFECT_API_URL to use a temporary one.")
    console.print(f"Prefect server: {shown} (PREFECT_API_URL)", highlight=False)
