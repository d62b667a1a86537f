"""deployments/prefect.yaml as a user runs it: a Prefect server, work pools, `prefect deploy`, a worker,
`prefect deployment run`, a backend that goes down partway, and `prefect flow-run retry`.

Every process the test starts is stopped by its PID. What the runs did is read from outside: the
chat server counts the requests it answered, and flow-run states come from Prefect's API.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import polars as pl
import pytest
import yaml
from chat_server import make_app
from loopback_servers import end_process_group, free_port, serve
from stage1_runs import REPO
from test_flow_engine import http_config, mascot, stats

pytestmark = pytest.mark.integration

PREFECT = str(Path(sys.executable).parent / "prefect")


def prefect(api: str, *arguments: str) -> str:
    done = subprocess.run([PREFECT, "--no-prompt", *arguments], capture_output=True, text=True, check=False,
                          cwd=REPO, env={**os.environ, "PREFECT_API_URL": api}, timeout=300)
    assert done.returncode == 0, f"prefect {' '.join(arguments)}:\n{(done.stdout + done.stderr)[-4000:]}"
    return done.stdout + done.stderr


def wait_for_state(api: str, flow_run: str, wanted: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = httpx.get(f"{api}/flow_runs/{flow_run}").raise_for_status().json()["state"]
        if state["type"] == wanted:
            return state
        assert state["type"] not in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"} - {wanted}, state
        time.sleep(0.5)
    raise AssertionError(f"flow run {flow_run} did not reach {wanted} within {timeout_s:g} s")


@pytest.fixture
def worker(prefect_api, tmp_path):
    """The work pools of deployments/prefect.yaml, its deployments, and a process worker on the local pool."""
    for pool in ("mascot-local", "mascot-gpu"):
        prefect(prefect_api, "work-pool", "create", pool, "--type", "process", "--overwrite")
    deployed = prefect(prefect_api, "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
    for name in ("stage1/stage1", "stage1/stage1-gpu", "stage2/stage2", "stage2/stage2-gpu", "evaluate/evaluate",
                 "evaluate/evaluate-gpu", "pipeline/pipeline", "pipeline/pipeline-gpu"):
        assert f"'{name}' successfully created" in deployed, deployed[-3000:]
    with (tmp_path / "worker.log").open("w") as log:
        process = subprocess.Popen([PREFECT, "worker", "start", "--pool", "mascot-local"], stdout=log,
                                   stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                   env={**os.environ, "PREFECT_API_URL": prefect_api})
    try:
        yield process
    finally:
        end_process_group(process)


def test_a_failed_deployment_run_is_retried_and_repeats_nothing(tmp_path, prefect_api, worker):
    app, port = make_app(seconds_per_token=0.1), free_port()  # 0.8 s a request: time to stop it partway
    config = http_config(tmp_path, "deployed", f"http://127.0.0.1:{port}", contexts=6)
    settings = yaml.safe_load(config.read_text())
    settings["generation"]["max_retries"] = 0
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    queries = 6 * 3
    with serve(make_app(seconds_per_token=0.01)) as other:  # an uninterrupted run, for the pairs to expect
        mascot(http_config(tmp_path, "reference", other, contexts=6), "reference", prefect_api)

    with serve(app, port=port):
        started = prefect(prefect_api, "deployment", "run", "stage1/stage1", "--param", f"config_path={config}",
                          "--param", "run_name=deployed", "--param", "until=pairs")
        flow_run = re.search(r"UUID: ([0-9a-f-]{36})", started)[1]
        deadline = time.monotonic() + 300
        while stats(f"http://127.0.0.1:{port}")["answered"] < queries // 3:
            assert time.monotonic() < deadline, "the deployment run sent too few requests"
            time.sleep(0.1)
    # The backend is down: the shards still sampling fail after their retries, and so does the run.
    failed = wait_for_state(prefect_api, flow_run, "FAILED")
    assert "stopped at sample_candidates" in failed["message"] and "mascot resume" in failed["message"]
    run = tmp_path / "runs" / "deployed"
    assert not (run / "stage1" / "pairs.parquet").exists()

    with serve(app, port=port) as chat:  # the backend is back
        prefect(prefect_api, "flow-run", "retry", flow_run)
        wait_for_state(prefect_api, flow_run, "COMPLETED")
        seen = stats(chat)
    assert seen["answered"] == queries and seen["answered_again"] == 0, seen
    expected = pl.read_parquet(tmp_path / "runs" / "reference" / "stage1" / "pairs.parquet")
    assert pl.read_parquet(run / "stage1" / "pairs.parquet").equals(expected)
    flow = httpx.get(f"{prefect_api}/flow_runs/{flow_run}").json()
    assert flow["name"] == "stage1/deployed"
