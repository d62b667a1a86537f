"""wandb for every stage: one run per flow run, and a way to log a stage's metrics to it.

Stages describe what they log with plain values, `Histogram`s and tables (lists of rows); only this
module knows wandb's types. The wandb config is the run config, redacted (`mascot.redaction`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
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


class _Pending:
    """The flow's wandb run: not started, starting in the background, or started."""

    def __init__(self, config: RunConfig, stage: str, starter: ThreadPoolExecutor):
        self.config, self.stage, self.starter = config, stage, starter
        self.run: Future | None = None
        self.lock = threading.Lock()

    def start(self) -> Future:
        with self.lock:
            if self.run is None:
                self.run = self.starter.submit(_init, self.config, self.stage)
            return self.run


_pending: _Pending | None = None


@contextlib.contextmanager
def wandb_run(config: RunConfig, stage: str, *, start: bool = True) -> Iterator[None]:
    """One wandb run for one flow run of `stage`; trainers and summaries inside the block log to it.

    It starts in a background thread: importing wandb and starting its service take about a second,
    which overlaps the stage's work instead of delaying it. Whatever logs waits for it (`active_run`),
    so nothing is lost. With `start=False` it starts only when something first logs, so a flow run
    whose steps were all cached, and so log nothing, leaves no empty wandb run behind.
    """
    global _pending
    if config.tracking.wandb_mode == "disabled":
        yield
        return
    if importlib.util.find_spec("wandb") is None:  # fail now, naming the extra, rather than in the thread
        raise ImportError("tracking.wandb_mode is not 'disabled' but wandb is not installed: "
                          "pip install 'mascot[wandb]', or set tracking.wandb_mode: disabled")
    config.run_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(1, thread_name_prefix="wandb-start") as starter:
        pending = _pending = _Pending(config, stage, starter)
        if start:
            pending.start()
        exit_code = 1
        try:
            yield
            exit_code = 0
        finally:
            _pending = None
            if pending.run is not None:
                pending.run.result().finish(exit_code=exit_code)


def _init(config: RunConfig, stage: str) -> Any:
    import wandb

    tracking = config.tracking
    return wandb.init(project=tracking.wandb_project, mode=tracking.wandb_mode, dir=str(config.run_dir),
                      name=f"{config.run.name}-{stage}", group=config.run.name, job_type=stage,
                      config=redact(config.model_dump(mode="json")))


def active_run() -> Any:
    """The wandb run to log to, started now if it was waiting for its first use, or None when there is none."""
    pending = _pending
    if pending is not None:
        return pending.start().result()
    wandb = sys.modules.get("wandb")  # outside a flow: a run the caller started, if any
    return wandb.run if wandb is not None else None


def log_metrics(stage: str, metrics: dict[str, Any]) -> str | None:
    """Log `metrics` as `<stage>/<name>` to the active wandb run; returns its folder, or None when there is none.

    A value is a number, a `Histogram`, or a table as a non-empty list of rows (dicts with the same keys).
    """
    run = active_run()
    if run is None:
        return None
    import wandb

    from mascot.stats import binnable

    # wandb checks every logged object against pandas.DataFrame, importing pandas and pyarrow to do so
    # (0.4 s and 60 MB, in a run that has no use for them) unless it believes pandas absent; then it
    # compares type names instead, which gives the same answer, a real data frame included.
    wandb.util.pd_available = False
    logged = {}
    for name, value in metrics.items():
        if isinstance(value, Histogram):
            value = (wandb.Histogram(binnable(value.values)) if value.values is not None
                     else wandb.Histogram(np_histogram=(value.counts, value.edges)))
        elif isinstance(value, list):
            # Mixed types: an entry may be null in one row (an undefined interval) and a number in the next.
            value = wandb.Table(columns=list(value[0]), rows=[list(row.values()) for row in value], allow_mixed_types=True)
        logged[f"{stage}/{name}"] = value
    run.log(logged)
    return run.dir
