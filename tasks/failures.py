"""Which step a flow run stopped at: each task notes its own failure, for the flow's last message.

An exception that reaches the flow does not say which task raised it, and a failed task run reaches
the Prefect server asynchronously, through events. So every task's `on_failure` hook notes its task
run's name here, per flow run, in the process that runs the flow (`failed_steps`).
"""

from __future__ import annotations

import threading
from collections import defaultdict

_failed: defaultdict[str, list[str]] = defaultdict(list)
_lock = threading.Lock()


def note_failure(task, task_run, state) -> None:
    """Prefect `on_failure` hook: runs once a task run has failed for good (after its retries)."""
    with _lock:
        _failed[str(task_run.flow_run_id)].append(task.name)


def failed_steps(flow_run_id: str) -> list[str]:
    """The tasks of a flow run that failed, in the order they failed."""
    with _lock:
        return list(_failed.get(flow_run_id, []))


# The options every task of a flow takes.
REPORTED = {"on_failure": [note_failure]}
