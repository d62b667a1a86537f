"""Runs against a backend that fails: a fault-injecting proxy (tests/fault_proxy.py) in front of the loopback
chat server. What was asked and answered is counted at the server and the proxy; what each step did is read
from the Prefect server."""

from __future__ import annotations

import os
import subprocess

import httpx
import polars as pl
import pytest
import yaml
from chat_server import make_app
from fault_proxy import KINDS, FaultProxy
from loopback_servers import serve
from prefect_states import flow_run_id, task_states
from stage1_runs import MASCOT
from test_flow_engine import http_config, mascot
from test_stage2_flow import http_stage2_config, run

pytestmark = pytest.mark.integration

STAGE1 = ("contexts", "candidates", "judgments", "pairs")
STAGE2 = ("episodes", "judgments", "pairs")


def faulty_backends(config, retries: int, timeout_s: float) -> None:
    """Every LLM role of the config on a server retries `retries` times, giving up on an answer after `timeout_s`."""
    settings = yaml.safe_load(config.read_text())
    stage2 = settings.get("stage2") or {}
    roles = [settings["generation"], *(stage2.get(role) for role in ("director", "speaker", "user")),
             *(judge.get("backend") for stage in (settings["stage1"], stage2) for judge in stage.get("judges", []))]
    for role in roles:
        if role and role["kind"] == "openai":
            role.update(max_retries=retries, timeout_s=timeout_s)
    config.write_text(yaml.safe_dump(settings, sort_keys=False))


def test_a_fifth_of_requests_failing_changes_no_output_and_no_request_is_answered_twice(tmp_path, prefect_api,
                                                                                        tiny_models):
    app = make_app(seconds_per_token=0.001)
    with serve(app) as chat, FaultProxy(chat, rate=0.2, seed=1, hang_s=3.0) as proxy:
        roots = {}
        for side, url in (("clean", chat), ("faulty", proxy.url)):
            httpx.post(f"{chat}/stats/reset")
            (tmp_path / side).mkdir()
            config = http_stage2_config(tmp_path / side, url)
            faulty_backends(config, retries=5, timeout_s=2.0)
            run("run", "stage1", "--config", str(config), "--run-name", "http", "--until", "pairs", api=prefect_api)
            run("run", "stage2", "--config", str(config), "--run-name", "http", api=prefect_api)
            roots[side] = tmp_path / side / "runs" / "http"
            counted = httpx.get(f"{chat}/stats").json()
            assert counted["answered_again"] == 0, (side, counted)  # each request answered once, faults or not
            if side == "clean":
                clean_answers = counted["answered"]
        assert counted["answered"] == clean_answers, "the faulty run asked the server exactly what the clean one did"
        assert all(proxy.faults[kind] > 0 for kind in KINDS), proxy.faults
        assert sum(proxy.faults.values()) > 0.1 * (sum(proxy.faults.values()) + proxy.forwarded)

    for stage, names in (("stage1", STAGE1), ("stage2", STAGE2)):
        for name in names:
            clean, faulty = (pl.read_parquet(roots[side] / stage / f"{name}.parquet") for side in ("clean", "faulty"))
            assert faulty.equals(clean), f"{stage}/{name} differs after faults"
    for model in ("stage2/group_rm/model.safetensors", "stage2/director/adapter_model.safetensors"):
        assert (roots["faulty"] / model).read_bytes() == (roots["clean"] / model).read_bytes(), model


def test_an_outage_fails_the_run_after_its_retries_and_a_resume_finishes_it(tmp_path, prefect_api):
    app = make_app(seconds_per_token=0.01)
    with serve(app) as chat, FaultProxy(chat, rate=1.0, seed=2, hang_s=1.5) as proxy:
        config = http_config(tmp_path, "outage", proxy.url, contexts=2)
        faulty_backends(config, retries=1, timeout_s=1.0)
        run_dir = tmp_path / "runs" / "outage"

        failed = mascot(config, "outage", prefect_api, status=1)
        output = failed.stdout + failed.stderr
        last = output.strip().splitlines()[-1]
        assert last.startswith("stage 1 stopped at sample_candidates: ") and "is unavailable" in last, last
        assert f"mascot resume {run_dir}" in " ".join(output.split()) and "Traceback" not in last
        ran = task_states(prefect_api, flow_run_id(output))
        assert ran["sample_candidates"] == {"Failed"} and not {"merge_shards", "build_pairs"} & set(ran), ran
        assert app.state.stats.requests == 0 and sum(proxy.faults.values()) > 0  # every attempt failed at the proxy
        flow_runs = httpx.post(f"{prefect_api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": ["stage1/outage"]}}})
        assert [flow_run["state"]["type"] for flow_run in flow_runs.json()] == ["FAILED"], "named after the run"
        assert {"profile:outage", "domain:emotional_support"} <= set(flow_runs.json()[0]["tags"])

        proxy.rate = 0.0  # the backend is back
        resumed = subprocess.run([MASCOT, "resume", str(run_dir)], capture_output=True, text=True, check=False,
                                 env={**os.environ, "PREFECT_API_URL": prefect_api}, timeout=600)
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-5000:]
        counted = app.state.stats
    assert counted.requests == counted.answered == 2 * 3 and counted.repeated == 0, counted.report()
    assert pl.read_parquet(run_dir / "stage1" / "pairs.parquet").height > 0
