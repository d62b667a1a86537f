"""Stage 1 on the worker processes of a local Dask cluster or Ray instance (runner.kind: dask, ray), two of them,
against the loopback chat server: the same pairs as the thread runner, and the configured limit holds for both
processes together, as the server counts the requests in flight."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import polars as pl
import psutil
import pytest
import yaml
from chat_server import make_app
from loopback_servers import serve
from stage1_runs import MASCOT
from test_flow_engine import LIMIT, http_config, mascot

pytestmark = pytest.mark.integration


def dask_workers(process: psutil.Process) -> int:
    """Worker processes under `process`: Dask's nannies start each one with multiprocessing's spawn."""
    return sum("spawn_main" in " ".join(child.cmdline()) for child in process.children(recursive=True))


def busy_ray_workers(process: psutil.Process) -> int:
    """Ray worker processes under `process` running a shard: the raylet's workers are titled ray::<task> while
    they run one, ray::IDLE otherwise. Ray replaces idle workers as it likes, so it is the busy ones that count."""
    return sum(" ".join(child.cmdline()).startswith(("ray::sample_candidates", "ray::judge_candidates"))
               for child in process.children(recursive=True))


@pytest.mark.parametrize("kind", ["dask", "ray"])
def test_stage1_on_two_worker_processes_gives_the_thread_runners_pairs_under_one_limit(tmp_path, prefect_api, kind):
    app = make_app(seconds_per_token=0.1)  # 0.8 s a request: both workers' shards wait on the limit at once
    with serve(app) as chat:
        threaded = http_config(tmp_path, "threads", chat)
        mascot(threaded, "threads", prefect_api)
        httpx.post(f"{chat}/stats/reset")

        config = http_config(tmp_path, kind, chat)
        settings = yaml.safe_load(config.read_text())
        settings["runner"] = {"kind": kind, "workers": 2}
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        process = subprocess.Popen([sys.executable, MASCOT, "run", "stage1", "--config", str(config), "--run-name",
                                    kind, "--until", "pairs"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env={**os.environ, "PREFECT_API_URL": prefect_api})
        count = dask_workers if kind == "dask" else busy_ray_workers
        watched, workers = psutil.Process(process.pid), 0
        while process.poll() is None:
            try:
                workers = max(workers, count(watched))
            except psutil.Error:  # a process that ended while it was read
                pass
            time.sleep(0.2)
        output = process.communicate()[0]
        assert process.returncode == 0, output[-5000:]
        seen = httpx.get(f"{chat}/stats").json()

    # Dask starts exactly its workers. Ray may briefly start a third while a judge waits on its upstream shard,
    # so there two at once is a lower bound; the server's count below is the limit that matters.
    assert workers == 2 if kind == "dask" else workers >= 2, f"{workers} {kind} worker processes ran shards"
    assert seen["requests"] == 8 * 3 and seen["repeated"] == 0, seen
    assert seen["max_in_flight"] == LIMIT, seen  # the limit holds for both processes together, and is reached
    pairs = {name: pl.read_parquet(tmp_path / "runs" / name / "stage1" / "pairs.parquet") for name in ("threads", kind)}
    assert pairs[kind].equals(pairs["threads"])
