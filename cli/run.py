"""`mascot run <stage>`: a pipeline stage as a Prefect flow, cached and resumable."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from cli.common import ConfigOption, console, fail, load
from cli.prefect_server import PrefectServerError, prefect_server
from mascot.config import RunConfig

run_app = typer.Typer(help="Run pipeline stages as Prefect flows (cached and resumable).", no_args_is_help=True)

# A temporary Prefect server sends no analytics (and needs longer than Prefect's default to start here).
PREFECT_DEFAULTS = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


RunNameOption = Annotated[str | None, typer.Option(help="Override run.name (the run directory's name).")]
RefreshOption = Annotated[bool, typer.Option(
    help="Recompute every step instead of reusing cached results. LLM requests are still answered by the request "
         "cache; training runs again.")]


class Stage1Step(str, Enum):
    pairs = "pairs"
    persona_rm = "persona_rm"
    speaker = "speaker"


@run_app.command("stage1")
def run_stage1(
    config: ConfigOption,
    run_name: RunNameOption = None,
    until: Annotated[Stage1Step, typer.Option(
        help="Last step: 'pairs' (data only), 'persona_rm' (+ reward model) or 'speaker' (+ GRPO and the "
             "before/after comparison).")] = Stage1Step.speaker,
    refresh: RefreshOption = False,
):
    """Stage 1: candidates, judgments and preference pairs; the persona reward model; the GRPO Speaker.

    Reruns skip every cached step; a killed run resumes where it stopped, training from its last
    checkpoint. Artifacts go to <run.output_dir>/<run name>/stage1/, with report.md and summary.json.

    The flow reports to the Prefect server at PREFECT_API_URL when it is set (keep one running with
    `mascot server start`), else to a temporary one started for this run; the first line of output
    says which.
    """
    # Fail fast, before Prefect starts, on a bad config, a bad run name, or (when training) this machine.
    loaded = load(config, check_machine=until is not Stage1Step.pairs)
    loaded = renamed(loaded, run_name)
    start_stage("stage1", config, loaded, run_name, until.value, refresh)


class DirectorMethod(str, Enum):
    grpo = "grpo"
    dpo = "dpo"


@run_app.command("stage2")
def run_stage2(
    config: ConfigOption,
    run_name: RunNameOption = None,
    director_method: Annotated[DirectorMethod, typer.Option(
        help="How the Director is trained: 'grpo' (default, the paper's method: GRPO against the group reward "
             "model) or 'dpo' (an alternative, NOT the paper's method: DPO over the branches' directive "
             "pairs).")] = DirectorMethod.grpo,
    refresh: RefreshOption = False,
):
    """Stage 2: branched episodes, the group judge and trajectory pairs; the group reward model; the Director.

    Reads the contexts and the Speaker of the same run's finished Stage 1 (same config and run name).
    Reruns skip every cached step; a killed run resumes where it stopped, without repeating an LLM
    request. Artifacts go to <run.output_dir>/<run name>/stage2/, with report.md and summary.json.
    The Prefect server is chosen as for `mascot run stage1`.
    """
    loaded = load(config, check_machine=True)
    if loaded.stage2 is None:
        fail(f"{config} has no 'stage2' section, so there is no Stage 2 to run; configs/tiny.yaml has one to copy")
    if director_method is DirectorMethod.dpo and loaded.train.director_dpo is None:
        fail(f"--director-method dpo trains train.director_dpo, which {config} does not have; configs/tiny.yaml "
             "has one to copy")
    loaded = renamed(loaded, run_name)
    from mascot.artifacts import ArtifactChanged, RunDir

    needed = ["stage1/contexts"] + (["stage1/speaker"] if loaded.stage2.speaker is None else [])
    try:
        for name in needed:  # the flow checks the same; here it fails before Prefect starts
            RunDir(loaded.run_dir).recorded(name, "stage 2")
    except (FileNotFoundError, ArtifactChanged) as exc:
        fail(str(exc))
    start_stage("stage2", config, loaded, run_name, director_method.value, refresh)


@run_app.command("evaluate")
def run_evaluate(config: ConfigOption, run_name: RunNameOption = None, refresh: RefreshOption = False):
    """The evaluation: MASCOT against named baselines and ablations, on held-out and out-of-domain contexts.

    Reads the same run's finished Stage 2 (and Stage 1). Every system answers every evaluation context
    with the same seeds; the config's own evaluation judges and the automatic metrics score them.
    Artifacts go to <run.output_dir>/<run name>/eval/, with report.md and summary.json. Reruns skip
    every cached step, and a killed run resumes without repeating an LLM request.
    """
    loaded = load(config, check_machine=True)
    if loaded.eval is None:
        fail(f"{config} has no 'eval' section, so there is nothing to evaluate; configs/tiny.yaml has one to copy")
    loaded = renamed(loaded, run_name)
    from mascot.artifacts import ArtifactChanged, RunDir

    try:
        for name in ("stage1/contexts", "stage1/candidates", "stage1/judgments", "stage2/director"):
            RunDir(loaded.run_dir).recorded(name, "the evaluation")
    except (FileNotFoundError, ArtifactChanged) as exc:
        fail(str(exc))
    start_stage("eval", config, loaded, run_name, "report", refresh)


@run_app.command("pipeline")
def run_pipeline(
    config: ConfigOption,
    run_name: RunNameOption = None,
    director_method: Annotated[DirectorMethod, typer.Option(
        help="How Stage 2 trains the Director: 'grpo' (default, the paper's method) or 'dpo' (an alternative, NOT "
             "the paper's method).")] = DirectorMethod.grpo,
    refresh: RefreshOption = False,
):
    """The whole recipe in one flow run: Stage 1, Stage 2 and the evaluation, as subflows.

    Each stage's steps are cached and resumable as when it runs alone; `mascot resume` after a failure
    reruns the pipeline from where it stopped. Ends with the evaluation report's path and its headline
    table. The Prefect server is chosen as for `mascot run stage1`.
    """
    loaded = load(config, check_machine=True)
    missing = [section for section in ("stage2", "eval") if getattr(loaded, section) is None]
    if missing:
        fail(f"{config} has no {' or '.join(repr(s) for s in missing)} section, so the pipeline cannot run all "
             "three stages; configs/tiny.yaml has them to copy")
    if director_method is DirectorMethod.dpo and loaded.train.director_dpo is None:
        fail(f"--director-method dpo trains train.director_dpo, which {config} does not have")
    loaded = renamed(loaded, run_name)
    start_stage("pipeline", config, loaded, run_name, director_method.value, refresh)


def renamed(loaded: RunConfig, run_name: str | None) -> RunConfig:
    """The config under `--run-name`, checked like `run.name`."""
    if run_name is None:
        return loaded
    try:
        return loaded.renamed(run_name)
    except ValidationError as exc:
        fail(f"--run-name {run_name!r}: {exc.errors()[0]['msg'].replace('String should', 'should')}")


def start_stage(stage: str, config: Path, loaded: RunConfig, run_name: str | None, step: str, refresh: bool) -> None:
    """Run a stage's flow on a validated config, and say where its artifacts are, or where it stopped.

    `step` is Stage 1's last step (`until`), Stage 2's Director method, or the evaluation's "report"."""
    for name, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    server = prefect_server()
    from prefect import tags

    from flows.failures import StageFailed
    from flows.runners import configured
    from mascot.artifacts import RunDir
    from mascot.llm.factory import preload

    # Prefect's import overlaps a temporary server's start.
    if stage == "stage1":
        from flows.stage1 import stage1 as flow

        parameters, label = {"until": step}, f"until {step}"
    elif stage in ("stage2", "pipeline"):
        if stage == "stage2":
            from flows.stage2 import stage2 as flow
        else:
            from flows.pipeline import pipeline as flow

        parameters, label = {"director_method": step}, f"director method {step}"
    else:
        from flows.evaluate import evaluate as flow

        parameters, label = {}, "every system"

    try:
        server.wait()
    except PrefectServerError as exc:
        fail(str(exc))
    console.print(server.describe(), highlight=False, soft_wrap=True)
    # The backend's SDK loads while Prefect sets the flow run up, rather than before the first request.
    first_backend = loaded.generation if stage in ("stage1", "pipeline") else loaded.stage2.director
    threading.Thread(target=preload, args=(first_backend,), daemon=True).start()
    try:
        # Tags find runs by profile (the config file's name) and domain in the UI and `prefect flow-run ls`.
        # A stage runs its shards on the config's task runner; the pipeline puts each of its stages on it.
        runner = contextlib.nullcontext(flow) if stage == "pipeline" else configured(flow, loaded, refresh)
        with tags(f"profile:{config.stem}", f"domain:{loaded.data.domain}"), runner as flow:
            artifacts = flow(str(config), run_name=run_name, refresh=refresh, **parameters)
    except StageFailed as exc:  # it names the step, the cause and the resume command
        fail(str(exc), code=1)
    run = RunDir(loaded.run_dir)
    title = {"eval": "evaluation", "pipeline": "pipeline"}.get(stage, stage.replace("stage", "stage "))
    console.print(f"[green]{title} done[/green] ({label}): {run.root}", highlight=False)
    for name, artifact in artifacts.items():
        console.print(f"  {name:<20} {run.contract_path(name, artifact)}", highlight=False, soft_wrap=True)
    if "eval/summary" in artifacts:
        from cli.headline import headline_table

        console.print(headline_table(artifacts["eval/summary"].path))
    # Python's last garbage collection at exit walks every object Prefect and pydantic made, 0.7 s on a
    # small machine, to free memory the OS takes back anyway. Frozen objects are left out of it.
    gc.freeze()


def resume(run_dir: Annotated[Path, typer.Argument(help="The run directory, <run.output_dir>/<run name>.")]):
    """Run a run's last stage again, as it was asked for: same config file, run name and last step.

    Reads <run_dir>/manifest.json. Every step that finished is a cache hit, no LLM request is sent
    twice, and an interrupted training resumes from its last checkpoint. Refused when the config
    file changed since (a different config would be a different run: use `mascot run`).
    """
    from mascot.artifacts import RunDir, content_sha256

    try:
        request = RunDir(run_dir).resume_request()
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    config = Path(request["config_path"])
    loaded = load(config, check_machine=request["until"] != "pairs").renamed(request["run_name"])
    if content_sha256(loaded) != request["config_hash"]:
        fail(f"{config} changed since {run_dir} ran it, so resuming would run another config. Run it with "
             f"`mascot run {request['stage']} --config {config} --run-name {request['run_name']}`, or restore "
             "the file (the manifest holds the config the run used).")
    console.print(f"resuming {request['stage']} of {run_dir} ({request['until']}) from {config}",
                  highlight=False)
    start_stage(request["stage"], config, loaded, request["run_name"], request["until"], refresh=False)
