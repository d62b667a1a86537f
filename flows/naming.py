"""Flow-run names: `<stage>/<run name>`, so that the UI and `prefect flow-run ls` show which run is which."""

from __future__ import annotations

from collections.abc import Callable

from prefect.runtime import flow_run

from mascot.config import load_config


def flow_run_name(stage: str) -> Callable[[], str]:
    """The `flow_run_name` of a stage's flow: the run name comes from the parameters, or from the config."""

    def name() -> str:
        parameters = flow_run.parameters
        return f"{stage}/{parameters.get('run_name') or load_config(parameters['config_path']).run.name}"

    return name


def resume_stage(stage: str) -> str | None:
    """The stage a flow records as the run's resume request: its own, unless it runs as a subflow of the
    pipeline, whose request (the whole pipeline) must stay, so that `mascot resume` reruns all of it."""
    return None if flow_run.parent_flow_run_id else stage
