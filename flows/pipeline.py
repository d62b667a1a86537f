"""The whole recipe in one flow run: Stage 1, Stage 2 and the evaluation, as subflows.

    mascot run pipeline --config configs/tiny.yaml [--director-method grpo|dpo] [--refresh]

Each stage is its own flow (its steps cached and resumable as when it runs alone), run here as a
subflow of one pipeline flow run, on the config's task runner (`flows.runners`). The run's resume request is the pipeline's, so `mascot resume`
after a failure reruns the pipeline: every finished step is a cache hit, and the stage that
stopped goes on from where it stopped.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.evaluate import evaluate
from flows.naming import flow_run_name
from flows.runners import configured
from flows.stage1 import stage1
from flows.stage2 import DirectorMethod, stage2
from mascot.artifacts import Artifact, RunDir
from mascot.config import load_config
from mascot.judges.panel import judge_rubric_problem


@flow(name="pipeline", flow_run_name=flow_run_name("pipeline"))
def pipeline(config_path: str, run_name: str | None = None, director_method: DirectorMethod = "grpo",
             refresh: bool = False) -> dict[str, Artifact]:
    """Stage 1, Stage 2 (its Director trained by `director_method`) and the evaluation of one config;
    returns every artifact written."""
    config = load_config(config_path, rubric_problem=judge_rubric_problem)
    if run_name:
        config = config.renamed(run_name)
    missing = [section for section in ("stage2", "eval") if getattr(config, section) is None]
    if missing:
        raise ValueError(f"{config_path} has no {' or '.join(repr(s) for s in missing)} section, so the pipeline "
                         "cannot run all three stages; configs/tiny.yaml has them")
    RunDir(config.run_dir).start(config, Path(config_path), stage="pipeline", until=director_method)
    with configured(stage1, config, refresh) as flow:
        artifacts = flow(config_path, run_name=run_name, until="speaker", refresh=refresh)
    with configured(stage2, config, refresh) as flow:
        artifacts |= flow(config_path, run_name=run_name, director_method=director_method, refresh=refresh)
    with configured(evaluate, config, refresh) as flow:
        return artifacts | flow(config_path, run_name=run_name, refresh=refresh)
