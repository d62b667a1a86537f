"""`mascot run <stage>`: a pipeline stage as a Prefect flow, cached and resumable."""

from __future__ import annotations

import gc
import os
import threading
from enum import Enum
from typing import Annotated

import typer
from pydantic import ValidationError

from cli.common import ConfigOption, console, fail, load
from cli.prefect_server import PrefectServerError, prefect_server

run_app = typer.Typer(help="Run pipeline stages as Prefect flows (cached and resumable).", no_args_is_help=True)

# A temporary Prefect server sends no analytics (and needs longer than Prefect's default to start here).
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
    `prefect server start --background`), else to a temporary one started for this run; the first
    line of output says which.
    """
    # Fail fast, before Prefect starts, on a bad config, a bad run name, or (when training) this machine.
    loaded = load(config, check_machine=until is not Stage1Step.pairs)
    if run_name is not None:
        try:
            loaded.renamed(run_name)
        except ValidationError as exc:
            fail(f"--run-name {run_name!r}: {exc.errors()[0]['msg'].replace('String should', 'should')}")
    for name, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    server = prefect_server()
    from flows.stage1 import stage1  # Prefect's import overlaps a temporary server's start
    from mascot.artifacts import ArtifactChanged, RunDir
    from mascot.judges.panel import JudgeFailureRateExceeded
    from mascot.llm import BackendError
    from mascot.llm.factory import preload
    from mascot.train.runtime import TrainingSetupError

    try:
        server.wait()
    except PrefectServerError as exc:
        fail(str(exc))
    console.print(server.describe(), highlight=False, soft_wrap=True)
    # The backend's SDK loads while Prefect sets the flow run up, rather than before the first request.
    threading.Thread(target=preload, args=(loaded.generation,), daemon=True).start()
    try:
        artifacts = stage1(str(config), run_name=run_name, until=until.value, refresh=refresh)
    except (JudgeFailureRateExceeded, BackendError, TrainingSetupError, ArtifactChanged) as exc:
        # Everything finished before the failure is cached: rerunning resumes from there.
        fail(f"stage 1 stopped: {exc}", code=1)
    run = RunDir(loaded.renamed(run_name).run_dir if run_name else loaded.run_dir)
    console.print(f"[green]stage 1 done[/green] (until {until.value}): {run.root}", highlight=False)
    for name, artifact in artifacts.items():
        console.print(f"  {name:<20} {run.contract_path(name, artifact)}", highlight=False, soft_wrap=True)
    # Python's last garbage collection at exit walks every object Prefect and pydantic made, 0.7 s on a
    # small machine, to free memory the OS takes back anyway. Frozen objects are left out of it.
    gc.freeze()
