"""Where a flow run's shards run: threads of its process (the default), or the worker processes of a local Dask
cluster or Ray instance.

The config's `runner` section chooses, and `configured` applies it when a stage starts (`mascot run` and
`mascot resume` for a stage, the pipeline for each of its stages): the stage's flow `with_options` the task
runner. A flow run on Dask or Ray spreads over processes, and what holds for the run must hold in each of them:
the Prefect settings of its steps (`step_settings`: where their cached results live, and `--refresh`),
which a flow sets for its own process only, reach the workers through their environment; and its limits
get a folder of their own (`mascot.llm.limits`: slot files locked while a request is in flight), named to
the workers and to this process alike.

A Dask cluster or Ray instance here is local: a cluster on several machines would need a limit that spans
machines too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from prefect import Flow
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, PREFECT_TASKS_REFRESH_CACHE, temporary_settings
from prefect.settings.legacy import Setting
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from mascot.artifacts import RunDir
from mascot.config import RunConfig, RunnerConfig
from mascot.llm.limits import LIMITS_DIR

# Threads mostly wait, on the backends' limits or on an upstream shard. A task only ever waits for tasks
# submitted before it, so any number of workers is free of deadlock; 16 keeps several shards queued at
# every backend without opening hundreds of task runs at once on a big config.
WORKERS = 16


def threads() -> ThreadPoolTaskRunner:
    return ThreadPoolTaskRunner(max_workers=WORKERS)


def step_settings(run: RunDir, refresh: bool) -> dict[Setting, object]:
    """The Prefect settings every step of a run works under: its cached results inside the run directory (so
    deleting a run drops its cache), and with `refresh`, every cached step computed again."""
    return {PREFECT_LOCAL_STORAGE_PATH: run.prefect_results, PREFECT_TASKS_REFRESH_CACHE: refresh}


@contextlib.contextmanager
def configured(flow: Flow, config: RunConfig, refresh: bool) -> Iterator[Flow]:
    """`flow`, to run `config` (with `refresh`) inside the block: under the run's step settings, which must be in
    place before the flow run starts (Prefect makes a flow run's result store then), on the config's runner."""
    settings = step_settings(RunDir(config.run_dir), refresh)
    with temporary_settings(updates=settings), _on_runner(flow, config, settings) as configured_flow:
        yield configured_flow


@contextlib.contextmanager
def _on_runner(flow: Flow, config: RunConfig, settings: dict[Setting, object]) -> Iterator[Flow]:
    runner = config.runner
    if runner.kind == "threads":
        yield flow
        return
    with tempfile.TemporaryDirectory(prefix="mascot-limits-") as limits:
        environment = {setting.name: str(value).lower() if isinstance(value, bool) else str(value)
                       for setting, value in settings.items()}
        task_runner = _local_cluster(runner, {**environment, LIMITS_DIR: limits})
        before = os.environ.get(LIMITS_DIR)
        os.environ[LIMITS_DIR] = limits  # tasks the flow runs itself (training's rollouts) share the limits
        try:
            yield flow.with_options(task_runner=task_runner)
        finally:
            if before is None:
                os.environ.pop(LIMITS_DIR, None)
            else:
                os.environ[LIMITS_DIR] = before


def _local_cluster(runner: RunnerConfig, environment: dict[str, str]) -> TaskRunner:
    """The task runner of a local cluster of `runner.workers` processes, each with `environment`; the flow run
    starts it, and stops it when it ends."""
    try:
        if runner.kind == "dask":
            from prefect_dask import DaskTaskRunner
        else:
            from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise ImportError(f"runner.kind is '{runner.kind}' but prefect-{runner.kind} is not installed: pip install "
                          f"'mascot[{runner.kind}]', or set runner.kind: threads") from exc
    if runner.kind == "dask":
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs={
            "n_workers": runner.workers, "threads_per_worker": runner.threads_per_worker, "processes": True,
            "dashboard_address": None, "env": environment})
    # A task takes one of the instance's CPUs, so `workers` processes run one shard each at a time. "local" starts
    # an instance of the flow run's own even where `ray start` left one running or RAY_ADDRESS names one: the
    # limits' slot files hold on this machine only.
    return RayTaskRunner(address="local", init_kwargs={
        "num_cpus": runner.workers, "num_gpus": 0, "include_dashboard": False,
        "runtime_env": {"env_vars": environment}})
