"""The last word of a flow run that fails: the step that stopped it, why, and how to resume."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from prefect.futures import PrefectFuture
from prefect.runtime import flow_run

from mascot.redaction import redact_text
from tasks.failures import failed_steps


class StageFailed(RuntimeError):
    """A stage stopped at a step; everything that finished before is kept, so resuming repeats none of it."""


def completed(futures: list[PrefectFuture]) -> list:
    """The futures' results, raising the first failure: a step never runs on inputs that did not complete."""
    return [future.result() for future in futures]


@contextlib.contextmanager
def stopped_at_step(stage: str, run_dir: Path) -> Iterator[None]:
    """Turn a failure in the block into a `StageFailed` naming the failed step and the resume command.

    Its message becomes the flow run's state message, and the CLI's last line.
    """
    try:
        yield
    except Exception as exc:
        steps = failed_steps(flow_run.id) if flow_run.id else []
        where = f" at {steps[0]}" if steps else ""
        reason = redact_text(str(exc)).rstrip(".")  # most messages end in a full stop; the sentence adds its own
        raise StageFailed(f"{stage} stopped{where}: {reason}. Everything finished before is kept; "
                          f"resume with `mascot resume {run_dir}`.") from exc
