"""Stage 1 on a local Ray instance of two worker processes (runner.kind: ray), against the loopback chat server:
the same pairs as the thread runner, and the configured limit holds for both processes together, as the server
counts the requests in flight."""

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

SHARD_TASKS = ("ray::sample_candidates", "ray::judge_candidates")


def busy_ray_workers(process: psutil.Process) -> set[int]:
    """Ray worker processes under `process` running a shard: the raylet's workers are titled ray::<task> while
    they run one, ray::IDLE otherwise. Ray replaces idle workers as it likes, so it is the busy ones that count."""
    try:
        return {child.pid for child in process.children(recursive=True)
                if " ".join(child.cmdline()).startswith(SHARD_TASKS)}
    except psutil.Error:
        return set()


def test_stage1_on_two_ray_workers_gives_the_thread_runners_pairs_under_one_limit(tmp_path, prefect_api):
    app = make_app(seconds_per_token=0.1)  # 0.8 s a request: both workers' shards wait on the limit at once
    with serve(app) as chat:
        threaded = http_config(tmp_path, "threads", chat)
        mascot(threaded, "threads", prefect_api)
        httpx.post(f"{chat}/stats/reset")

        config = http_config(tmp_path, "ray", chat)
        settings = yaml.safe_load(config.read_text())
        settings["runner"] = {"kind": "ray", "workers": 2}
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        process = subprocess.Popen([sys.executable, MASCOT, "run", "stage1", "--config", str(config), "--run-name",
                                    "ray", "--until", "pairs"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env={**os.environ, "PREFECT_API_URL": prefect_api})
        watched, at_once = psutil.Process(process.pid), 0
        while process.poll() is None:
            at_once = max(at_once, len(busy_ray_workers(watched)))
            time.sleep(0.2)
        output = process.communicate()[0]
        assert process.returncode == 0, output[-5000:]
        seen = httpx.get(f"{chat}/stats").json()

    # Two at once: the shards spread over both workers. (Ray may briefly start a third worker while a judge
    # waits on its upstream shard, so this is not an upper bound; the server's count below is.)
    assert at_once >= 2, f"{at_once} Ray worker processes ran shards at once"
    assert seen["requests"] == 8 * 3 and seen["repeated"] == 0, seen
    assert seen["max_in_flight"] == LIMIT, seen  # the limit holds for both processes together, and is reached
    pairs = {name: pl.read_parquet(tmp_path / "runs" / name / "stage1" / "pairs.parquet") for name in ("threads", "ray")}
    assert pairs["ray"].equals(pairs["threads"])
