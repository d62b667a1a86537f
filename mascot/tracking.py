"""wandb for every stage: one run per flow run, and a way to log a stage's metrics to it.

Stages describe what they log with plain values, `Histogram`s and tables (lists of rows); only this
module knows wandb's types. The wandb config is the run config, redacted (`mascot.redaction`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
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


@contextlib.contextmanager
def wandb_run(config: RunConfig, stage: str) -> Iterator[Any]:
    """One wandb run for one flow run of `stage`; trainers and summaries inside it log to it. None when disabled."""
    tracking = config.tracking
    if tracking.wandb_mode == "disabled":
        yield None
        return
    try:
        import wandb
    except ImportError as exc:
        raise ImportError("tracking.wandb_mode is not 'disabled' but wandb is not installed: "
                          "pip install 'mascot[wandb]', or set tracking.wandb_mode: disabled") from exc
    config.run_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(project=tracking.wandb_project, mode=tracking.wandb_mode, dir=str(config.run_dir),
                     name=f"{config.run.name}-{stage}", group=config.run.name, job_type=stage,
                     config=redact(config.model_dump(mode="json")))
    exit_code = 1
    try:
        yield run
        exit_code = 0
    finally:
        run.finish(exit_code=exit_code)


def log_metrics(stage: str, metrics: dict[str, Any]) -> str | None:
    """Log `metrics` as `<stage>/<name>` to the active wandb run; returns its folder, or None when there is none.

    A value is a number, a `Histogram`, or a table as a non-empty list of rows (dicts with the same keys).
    """
    try:
        import wandb
    except ImportError:
        return None
    if wandb.run is None:
        return None
    logged = {}
    for name, value in metrics.items():
        if isinstance(value, Histogram):
            value = (wandb.Histogram(value.values) if value.values is not None
                     else wandb.Histogram(np_histogram=(value.counts, value.edges)))
        elif isinstance(value, list):
            value = wandb.Table(columns=list(value[0]), data=[list(row.values()) for row in value])
        logged[f"{stage}/{name}"] = value
    wandb.run.log(logged)
    return wandb.run.dir
