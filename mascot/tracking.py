"""wandb for every stage: one run per flow run, and a way to log a stage's metrics to it.

Stages describe what they log with plain values, `Histogram`s and tables (lists of rows); only this
module knows wandb's types. The wandb config is the run config, redacted (`mascot.redaction`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mascot.config import RunConfig
from mascot.redaction import redact


@dataclass(frozen=True)
class Histogram:
    """Raw `values`, or a histogram already binned into `counts` over `edges`."""

    values: Sequence[float] | None = None
    counts: Sequence[int] | None = None
    edges: Sequence[float] | None = None


_starting: Future | None = None  # the wandb run being started in the background, if any


@contextlib.contextmanager
def wandb_run(config: RunConfig, stage: str) -> Iterator[None]:
    """One wandb run for one flow run of `stage`; trainers and summaries inside the block log to it.

    It starts in a background thread: importing wandb and starting its service take about a second,
    which overlaps the stage's first requests instead of delaying them. Whatever logs waits for it
    (`active_run`), so nothing is lost.
    """
    global _starting
    if config.tracking.wandb_mode == "disabled":
        yield
        return
    try:
        import wandb  # noqa: F401  (only to fail now, with the extra to install, rather than in the thread)
    except ImportError as exc:
        raise ImportError("tracking.wandb_mode is not 'disabled' but wandb is not installed: "
                          "pip install 'mascot[wandb]', or set tracking.wandb_mode: disabled") from exc
    config.run_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1, thread_name_prefix="wandb-start") as starter:
        _starting = starter.submit(_start, config, stage)
        exit_code = 1
        try:
            yield
            exit_code = 0
        finally:
            run, _starting = _starting.result(), None
            run.finish(exit_code=exit_code)


def _start(config: RunConfig, stage: str) -> Any:
    import wandb

    tracking = config.tracking
    return wandb.init(project=tracking.wandb_project, mode=tracking.wandb_mode, dir=str(config.run_dir),
                      name=f"{config.run.name}-{stage}", group=config.run.name, job_type=stage,
                      config=redact(config.model_dump(mode="json")))


def active_run() -> Any:
    """The flow's wandb run, once started, or None when there is none."""
    starting = _starting
    if starting is not None:
        return starting.result()
    try:
        import wandb
    except ImportError:
        return None
    return wandb.run


def log_metrics(stage: str, metrics: dict[str, Any]) -> str | None:
    """Log `metrics` as `<stage>/<name>` to the active wandb run; returns its folder, or None when there is none.

    A value is a number, a `Histogram`, or a table as a non-empty list of rows (dicts with the same keys).
    """
    run = active_run()
    if run is None:
        return None
    import wandb

    logged = {}
    for name, value in metrics.items():
        if isinstance(value, Histogram):
            value = (wandb.Histogram(value.values) if value.values is not None
                     else wandb.Histogram(np_histogram=(value.counts, value.edges)))
        elif isinstance(value, list):
            value = wandb.Table(columns=list(value[0]), data=[list(row.values()) for row in value])
        logged[f"{stage}/{name}"] = value
    run.log(logged)
    return run.dir
