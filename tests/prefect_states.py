"""What a flow run did, read from the Prefect server's API: its task runs and their states, once settled.

Tests read these rather than what the code under test prints about itself: a step's `Cached` or
`Completed` state is the server's record of whether it ran.
"""

from __future__ import annotations

import re
import time

import httpx

UNFINISHED = {"RUNNING", "SCHEDULED"}


def flow_run_id(output: str) -> str:
    """The flow run a `mascot run` process reported to (the first one its output links to)."""
    return re.search(r"/runs/flow-run/([0-9a-f-]{36})", output)[1]


def task_runs(api: str, flow_run: str) -> list[dict]:
    """The flow run's task runs, once their states have settled.

    Task-run states reach the server as events, processed in the background: wait until every run
    has a state, none is running or awaiting a retry, and two reads a second apart agree. (A task whose
    input failed stays Pending for good.)
    """
    deadline, last = time.monotonic() + 60, None
    while True:
        answer = httpx.post(f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [flow_run]}}, "limit": 200})
        runs = answer.raise_for_status().json()
        # A task run the server has created but whose first state it has not processed yet has none.
        seen = sorted((run["id"], (run["state"] or {}).get("name")) for run in runs)
        settled = seen == last and all(run["state"] and run["state"]["type"] not in UNFINISHED for run in runs)
        if settled or time.monotonic() > deadline:
            return runs
        last = seen
        time.sleep(1)


def task_states(api: str, flow_run: str) -> dict[str, set[str]]:
    """Each task's state names in the flow run: {"sample_candidates": {"Cached"}, ...}."""
    found: dict[str, set[str]] = {}
    for run in task_runs(api, flow_run):
        found.setdefault(run["name"].rsplit("-", 1)[0], set()).add(run["state"]["name"])
    return found


def latest_flow_runs(api: str, names: list[str]) -> dict[str, dict]:
    """The newest flow run of each name."""
    runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": names}}, "limit": 200})
    newest: dict[str, dict] = {}
    for run in sorted(runs.raise_for_status().json(), key=lambda run: run["created"]):
        newest[run["name"]] = run
    return newest
