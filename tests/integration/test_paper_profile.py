"""The paper profile end to end on a CPU (issue 34): configs/paper.yaml with the overlay of
tests/data/paper_overlay.yaml (tests/paper_overlay.py), which swaps only what a CPU cannot run, run by
`mascot run pipeline`, and as the `pipeline-gpu` deployment by a worker through a server restart and a resume.

Two loopback servers stand in for the paper's: one plays vLLM serving the tiny LM, answering through PEFT with
the adapters the flow loads into it at runtime (tests/served_models.py), the other plays the judges' APIs in
OpenAI's wire format (tests/chat_server.py). Nobody steps in between stages. Flow-run states are read from the
Prefect server, and what was asked is counted at the two servers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from chat_server import make_app
from loopback_servers import end_process_group, free_port, serve
from paper_overlay import SERVED_BASE, paper_on_cpu
from prefect_states import flow_run_id, latest_flow_runs
from served_models import ServedModels, TransformersEngine
from stage1_runs import MASCOT, REPO
from test_deployments import PREFECT, prefect, wait_for_state

pytestmark = pytest.mark.integration

KEYS = {"OPENAI_API_KEY": "sk-loopback-judges", "VLLM_API_KEY": "loopback-vllm"}


def loopback_servers(tiny_models) -> tuple[ServedModels, object, object]:
    """The vLLM stand-in (its served models, its app) and the judges' server, each key checked where it is due."""
    served = ServedModels(SERVED_BASE, root=str(tiny_models.lm), allow_runtime_lora=True,
                          engine=TransformersEngine(tiny_models.lm))
    vllm = make_app(seconds_per_token=0.0, served=served, api_keys={KEYS["VLLM_API_KEY"]})
    return served, vllm, make_app(seconds_per_token=0.0, api_keys=set(KEYS.values()))


def served_names(run: Path) -> list[str]:
    """The Speaker's and the Director's names on the server, from the adapters the run recorded."""
    manifest = json.loads((run / "manifest.json").read_text())
    return [f"{role}-{manifest['artifacts'][artifact]['sha256'][:8]}"
            for role, artifact in (("speaker", "stage1/speaker"), ("director", "stage2/director"))]


def policy_snapshots(served: ServedModels, config: dict) -> list[str]:
    """The Director's GRPO snapshots the flow loaded, after the Speaker: one a step, each named by its folder's
    content and unloaded once the next step's (or the end of training) replaced it."""
    snapshots = [name for name in served.loads if name.startswith("director-")][:-1]  # the last: the trained one
    assert len(snapshots) == config["train"]["director"]["max_steps"], served.loads
    assert snapshots == [f"director-{served.contents[name][:8]}" for name in snapshots], served.contents
    assert set(snapshots) <= set(served.unloads) and not set(snapshots) & set(served.modules), served.unloads
    return snapshots


def test_the_paper_profile_runs_to_completed_with_adapters_registered_at_runtime_and_llm_judge_panels(
        tmp_path, prefect_api, tiny_models):
    served, vllm, judges = loopback_servers(tiny_models)
    with serve(vllm) as vllm_url, serve(judges) as judges_url:
        config = paper_on_cpu(tmp_path, vllm_url, judges_url)
        done = subprocess.run([MASCOT, "run", "pipeline", "--config", str(config), "--run-name", "paper"],
                              capture_output=True, text=True, check=False, timeout=900,
                              env={**os.environ, **KEYS, "PREFECT_API_URL": prefect_api})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]

    # Completed, as the Prefect server has it: the pipeline's flow run and each stage's under it.
    pipeline = httpx.get(f"{prefect_api}/flow_runs/{flow_run_id(output)}").raise_for_status().json()
    assert pipeline["name"] == "pipeline/paper" and pipeline["state"]["type"] == "COMPLETED", pipeline["state"]
    stages = latest_flow_runs(prefect_api, ["stage1/paper", "stage2/paper", "evaluate/paper"])
    assert {name: flow["state"]["type"] for name, flow in stages.items()} == dict.fromkeys(stages, "COMPLETED")
    assert len(stages) == 3

    # The trained Speaker and Director reached the served engine as steps of the flow, under their content's
    # names, and requests named them; so did the Director's policy snapshot of each GRPO step, which made the
    # rollouts' later directives there and was unloaded when training moved on; the base model served the rest.
    speaker, director = served_names(tmp_path / "runs" / "paper")
    snapshots = policy_snapshots(served, yaml.safe_load(config.read_text()))
    assert served.loads == [speaker, *snapshots, director], served.loads
    asked = vllm.state.stats.by_model
    assert asked.get(SERVED_BASE, 0) > 0 and all(asked.get(name, 0) > 0
                                                 for name in [speaker, *snapshots, director]), asked
    # Stage 2's before/after sampled the trained Director there too: its only requests that ask for no JSON schema
    # (a Director's turn in a conversation, the evaluation's included, always asks for one).
    assert any(body["model"] == director and not body.get("response_format")
               for body in map(json.loads, vllm.state.stats.seen)), "the before/after sampled it elsewhere"

    # Every judge of the paper's panels was asked at the judges' server, by the model the profile names.
    paper = yaml.safe_load(config.read_text())
    panels = [*paper["stage1"]["judges"], *paper["stage2"]["judges"], *paper["eval"]["judges"],
              *paper["eval"]["group_judges"], paper["eval"]["pairwise"]]
    judged = judges.state.stats.by_model
    assert all(judged.get(judge["backend"]["model"], 0) > 0 for judge in panels), judged
    assert judges.state.stats.authorized == {KEYS["OPENAI_API_KEY"]: judged["gpt-4o-2024-08-06"],
                                             KEYS["VLLM_API_KEY"]: sum(judged.values()) - judged["gpt-4o-2024-08-06"]}
    for server in (vllm, judges):
        assert server.state.stats.answered_again == 0, server.state.stats.report()


def gpu_shaped_deployment(folder: Path, config: Path) -> Path:
    """deployments/prefect.yaml's `pipeline-gpu` deployment, the GPU machine's folders and variables swapped for
    this one's (the checkout, the test's cache, no GPU, wandb offline) and its config for the overlaid profile."""
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    deployment = next(entry for entry in spec["deployments"] if entry["name"] == "pipeline-gpu")
    assert deployment["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "/srv/mascot"}}]
    deployment["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"] = str(REPO)
    variables = deployment["work_pool"]["job_variables"]
    assert set(variables) == {"working_dir", "env"} and variables["env"]["WANDB_MODE"] == "online"
    variables["working_dir"] = str(REPO)
    variables["env"].update(MASCOT_CACHE_DIR=str(folder / "cache"), CUDA_VISIBLE_DEVICES="", WANDB_MODE="offline")
    assert deployment["parameters"]["config_path"] == "configs/paper.yaml"
    deployment["parameters"]["config_path"] = str(config)
    path = folder / "prefect.yaml"
    path.write_text(yaml.safe_dump({**spec, "deployments": [deployment]}, sort_keys=False))
    return path


@pytest.fixture
def gpu_worker(prefect_api, tmp_path):
    """A process worker on the GPU pool (the keys in its environment, as a GPU machine's worker has them)."""
    prefect(prefect_api, "work-pool", "create", "mascot-gpu", "--type", "process", "--overwrite")
    with (tmp_path / "worker.log").open("w") as log:
        process = subprocess.Popen([PREFECT, "worker", "start", "--pool", "mascot-gpu"], stdout=log,
                                   stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                                   env={**os.environ, **KEYS, "PREFECT_API_URL": prefect_api,
                                        "PREFECT_WORKER_QUERY_SECONDS": "1"})
    try:
        yield process
    finally:
        end_process_group(process)


def test_the_gpu_deployment_of_the_paper_profile_survives_a_server_restart_in_stage2_through_mascot_resume(
        tmp_path, prefect_api, tiny_models, gpu_worker):
    served, vllm, judges = loopback_servers(tiny_models)
    port = free_port()
    run = tmp_path / "runs" / "deployed"
    with serve(judges) as judges_url:
        with serve(vllm, port=port) as vllm_url:
            config = paper_on_cpu(tmp_path, vllm_url, judges_url)
            prefect(prefect_api, "deploy", "--all", "--prefect-file", str(gpu_shaped_deployment(tmp_path, config)))
            started = prefect(prefect_api, "deployment", "run", "pipeline/pipeline-gpu", "--param", "run_name=deployed")
            flow_run = re.search(r"UUID: ([0-9a-f-]{36})", started)[1]
            deadline = time.monotonic() + 300
            while not served.loads or vllm.state.stats.by_model.get(served.loads[0], 0) < 1:
                state = httpx.get(f"{prefect_api}/flow_runs/{flow_run}").json()["state"]["type"]
                assert state in {"SCHEDULED", "PENDING", "RUNNING"} and time.monotonic() < deadline, state
                time.sleep(0.05)
            # The outage, once Stage 2's Speaker (loaded into the server by the flow) has answered: the server goes
            # down and comes back restarted, without the adapters loaded into it, as vLLM does. The Speaker's
            # requests are refused, and the deployment's run fails at Stage 2 after its retries.
            served.modules.clear()
        with serve(vllm, port=port):
            wait_for_state(prefect_api, flow_run, "FAILED")
            stages = latest_flow_runs(prefect_api, ["stage1/deployed", "stage2/deployed", "evaluate/deployed"])
            assert {name: flow["state"]["type"] for name, flow in stages.items()} == {
                "stage1/deployed": "COMPLETED", "stage2/deployed": "FAILED"}, "the outage stopped Stage 2"
            assert not (run / "stage2" / "episodes.parquet").exists(), "in the middle of Stage 2's episodes"
            resumed = subprocess.run([MASCOT, "resume", str(run)], capture_output=True, text=True, check=False,
                                     timeout=900, env={**os.environ, **KEYS, "PREFECT_API_URL": prefect_api})
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and "pipeline done" in output, output[-5000:]
    finished = httpx.get(f"{prefect_api}/flow_runs/{flow_run_id(output)}").raise_for_status().json()
    assert finished["name"] == "pipeline/deployed" and finished["state"]["type"] == "COMPLETED", finished["state"]

    speaker, director = served_names(run)
    snapshots = policy_snapshots(served, yaml.safe_load(config.read_text()))
    assert served.loads == [speaker, speaker, *snapshots, director], served.loads  # the resume loaded the Speaker again
    for server in (vllm, judges):  # every request answered once, across the outage and the resume
        assert server.state.stats.answered_again == 0, server.state.stats.report()
