"""The paper profile end to end on a CPU (issue 34): `mascot run pipeline` on configs/paper.yaml with the overlay of
tests/data/paper_overlay.yaml (tests/paper_overlay.py), which swaps only what a CPU cannot run.

Two loopback servers stand in for the paper's: one plays vLLM serving the tiny LM, answering through PEFT with
the adapters the flow loads into it at runtime (tests/served_models.py), the other plays the judges' APIs in
OpenAI's wire format (tests/chat_server.py). Nobody steps in between stages. The flow run's state is read from
the Prefect server, and what was asked is counted at the two servers.
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest
import yaml
from chat_server import make_app
from loopback_servers import serve
from paper_overlay import SERVED_BASE, paper_on_cpu
from prefect_states import flow_run_id, latest_flow_runs
from served_models import ServedModels, TransformersEngine
from stage1_runs import MASCOT

pytestmark = pytest.mark.integration

KEYS = {"OPENAI_API_KEY": "sk-loopback-judges", "VLLM_API_KEY": "loopback-vllm"}


def test_the_paper_profile_runs_to_completed_with_adapters_registered_at_runtime_and_llm_judge_panels(
        tmp_path, prefect_api, tiny_models):
    served = ServedModels(SERVED_BASE, root=str(tiny_models.lm), allow_runtime_lora=True,
                          engine=TransformersEngine(tiny_models.lm))
    vllm = make_app(seconds_per_token=0.0, served=served, api_keys={KEYS["VLLM_API_KEY"]})
    judges = make_app(seconds_per_token=0.0, api_keys=set(KEYS.values()))
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
    assert {name: run["state"]["type"] for name, run in stages.items()} == dict.fromkeys(stages, "COMPLETED")
    assert len(stages) == 3

    # The trained Speaker and Director reached the served engine as steps of the flow, under their content's
    # names, and requests named them; the base model served the rest.
    manifest = json.loads((tmp_path / "runs" / "paper" / "manifest.json").read_text())
    names = [f"{role}-{manifest['artifacts'][artifact]['sha256'][:8]}"
             for role, artifact in (("speaker", "stage1/speaker"), ("director", "stage2/director"))]
    assert served.loads == names, served.loads
    asked = vllm.state.stats.by_model
    assert asked.get(SERVED_BASE, 0) > 0 and all(asked.get(name, 0) > 0 for name in names), asked

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
