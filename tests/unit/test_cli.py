"""The `mascot` commands end to end on the tiny profile (real tiny model, real request cache)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from stage1_runs import write_config
from typer.testing import CliRunner

from cli.main import app
from mascot.config import load_config
from mascot.data import SAMPLES_DIR

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")
runner = CliRunner()


@pytest.mark.parametrize("command", [[], ["config"], ["data"], ["models"], ["sample"], ["run"], ["config", "validate"],
                                     ["data", "preview"], ["models", "build"], ["run", "stage1"], ["resume"],
                                     ["server"], ["server", "start"], ["server", "stop"], ["server", "status"], ["chat"],
                                     ["eval", "rate"], ["init"]])
def test_every_command_explains_itself(command):
    result = runner.invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output and len(result.output.splitlines()) > 4


def test_version():
    import mascot

    mascot_command = Path(sys.executable).parent / "mascot"
    result = subprocess.run([str(mascot_command), "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"mascot {mascot.__version__}"


def test_a_bad_run_name_is_refused_before_anything_runs(tmp_path):
    result = runner.invoke(app, ["run", "stage1", "--config", TINY, "--run-name", "../escape", "--until", "pairs"])
    assert result.exit_code == 2, result.output
    assert "--run-name '../escape'" in result.output and "match pattern" in result.output


def test_a_prefect_server_that_does_not_answer_is_named_before_anything_runs(tmp_path, monkeypatch):
    with socket.socket() as probe:  # a free port: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        url = f"http://user:secret@127.0.0.1:{port}/api"
    monkeypatch.setenv("PREFECT_API_URL", url)
    result = subprocess.run([str(Path(sys.executable).parent / "mascot"), "run", "stage1", "--config", TINY,
                             "--run-name", "unreachable", "--until", "pairs"], capture_output=True, text=True,
                            check=False, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    message = " ".join((result.stdout + result.stderr).split())
    assert "no Prefect server answers there" in message and f"mascot server start --port {port}" in message
    assert "secret" not in message, "credentials in the URL are not echoed"
    assert not (REPO / "runs" / "unreachable").exists()


def test_the_prefect_profile_is_read_without_importing_prefect(tmp_path, monkeypatch):
    from cli.prefect_server import prefect_server

    (tmp_path / "profiles.toml").write_text('active = "local"\n\n[profiles.local]\n'
                                            'PREFECT_API_URL = "http://127.0.0.1:4200/api"\n')
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(tmp_path / "profiles.toml"))
    server = prefect_server()
    assert server.url == "http://127.0.0.1:4200/api" and not server.temporary
    assert server.describe() == "Prefect server: http://127.0.0.1:4200/api (PREFECT_API_URL)"


def test_resume_refuses_a_folder_without_a_manifest_and_a_changed_config(tmp_path):
    from mascot.artifacts import RunDir
    from mascot.config import load_config

    result = runner.invoke(app, ["resume", str(tmp_path)])
    assert result.exit_code == 2 and "has no manifest.json" in result.output

    config = tmp_path / "tiny.yaml"
    config.write_text((REPO / "configs" / "tiny.yaml").read_text().replace("output_dir: ../runs", "output_dir: runs")
                      .replace(": rosters/", f": {REPO}/configs/rosters/").replace(": users/", f": {REPO}/configs/users/")
                      .replace(": rubrics/", f": {REPO}/configs/rubrics/"))
    loaded = load_config(config)
    RunDir(loaded.run_dir).start(loaded, config, stage="stage1", until="pairs")
    config.write_text(config.read_text().replace("seed: 0", "seed: 1", 1))
    result = runner.invoke(app, ["resume", str(loaded.run_dir)])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "changed since" in message and f"--run-name {loaded.run.name}" in message


def test_sample_prints_k_candidates_then_replays_from_the_cache(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setenv("MASCOT_CACHE_DIR", str(tiny_models.lm.parents[2]))  # reuse the session's build
    args = ["sample", "--config", str(write_config(tmp_path)), "--contexts", "2", "--k", "3", "--persona", "anchor",
            "--persona", "catalyst"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert first.output.count("The Anchor |") == 2 and first.output.count("The Catalyst |") == 2
    assert len(re.findall(r"^│ 3\. ", first.output, flags=re.MULTILINE)) == 4  # K=3 for each of 4 queries
    misses = int(re.search(r"(\d+) misses", first.output).group(1))
    assert misses >= 4
    second = runner.invoke(app, args)
    assert second.exit_code == 0
    assert f"{misses} hits, 0 misses" in second.output
    assert second.output.split("request cache")[0] == first.output.split("request cache")[0]
    assert "Loading weights" not in first.output  # transformers' own bars stay out of the way


def test_sample_rejects_unknown_persona():
    result = runner.invoke(app, ["sample", "--config", TINY, "--persona", "oracle"])
    assert result.exit_code == 2
    assert "no persona 'oracle'" in result.output and "anchor" in result.output


def test_sample_reports_an_unreachable_server(tmp_path):
    config = Path(TINY).read_text().replace(
        "generation:\n  kind: transformers\n  model: tiny:lm\n  device: cpu\n",
        "generation:\n  kind: openai\n  model: tiny\n  base_url: http://127.0.0.1:9/v1\n  max_retries: 0\n"
        "  timeout_s: 2\n",
    ).replace("rosters/", f"{REPO}/configs/rosters/").replace("users/", f"{REPO}/configs/users/").replace(
        "rubrics/", f"{REPO}/configs/rubrics/")
    path = tmp_path / "server.yaml"
    path.write_text(config)
    result = runner.invoke(app, ["sample", "--config", str(path), "--contexts", "1", "--persona", "anchor"])
    assert result.exit_code == 1, result.output
    assert "http://127.0.0.1:9/v1" in result.output and "vllm serve" in result.output


@pytest.mark.parametrize("source, path, expected", [
    ("empathetic_dialogues", "empathetic_dialogues", "ed:train:"),
    ("qmsum", "qmsum", "meeting="),
    ("esconv", "esconv/ESConv.json", "esconv:test:"),
])
def test_data_preview(source, path, expected):
    result = runner.invoke(app, ["data", "preview", "--source", source, "--path", str(SAMPLES_DIR / path), "-n", "2"])
    assert result.exit_code == 0, result.output
    assert expected in result.output


def test_data_preview_from_config_is_seeded():
    first = runner.invoke(app, ["data", "preview", "--config", TINY, "-n", "2", "--seed", "3"])
    again = runner.invoke(app, ["data", "preview", "--config", TINY, "-n", "2", "--seed", "3"])
    assert first.exit_code == 0 and first.output == again.output


def test_data_preview_names_the_broken_record(tmp_path):
    broken = tmp_path / "ESConv.json"
    broken.write_text('[{"emotion_type": "anxiety"}]')
    result = runner.invoke(app, ["data", "preview", "--source", "esconv", "--path", str(broken)])
    assert result.exit_code == 2
    assert str(broken) in result.output and "dialogue 0" in result.output and "experience_type" in result.output


def test_every_flow_has_a_deployment_on_each_pool():
    import ast

    import yaml

    flows = {f"flows/{path.name}:{node.name}" for path in (REPO / "flows").glob("*.py")
             for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)
             and any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "flow" for d in node.decorator_list)}
    deployments = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]
    pools = {(d["entrypoint"], d["work_pool"]["name"]) for d in deployments}
    assert flows == {"flows/stage1.py:stage1", "flows/stage2.py:stage2", "flows/evaluate.py:evaluate",
                     "flows/pipeline.py:pipeline"}
    assert pools == {(flow, pool) for flow in flows for pool in ("mascot-local", "mascot-gpu")}


def test_init_copies_the_shipped_profiles_out_and_keeps_what_is_there(tmp_path):
    result = runner.invoke(app, ["init", str(tmp_path / "study")])
    assert result.exit_code == 0, result.output
    copied = sorted(str(p.relative_to(tmp_path / "study" / "configs")) for p in (tmp_path / "study").rglob("*.yaml"))
    shipped = sorted(str(p.relative_to(REPO / "configs")) for p in (REPO / "configs").rglob("*.yaml"))
    assert copied == shipped and "tiny.yaml" in copied and "rosters/emotional_support.yaml" in copied
    config = tmp_path / "study" / "configs" / "tiny.yaml"
    validated = runner.invoke(app, ["config", "validate", str(config)])
    assert validated.exit_code == 0, validated.output
    assert load_config(config).run_dir == tmp_path / "study" / "runs" / "tiny"  # beside the copied configs
    config.write_text("# mine\n")
    refused = runner.invoke(app, ["init", str(tmp_path / "study")])
    assert refused.exit_code == 2 and "already has 15 of the shipped files" in " ".join(refused.output.split())
    assert config.read_text() == "# mine\n"
    assert runner.invoke(app, ["init", str(tmp_path / "study"), "--force"]).exit_code == 0
    assert config.read_text() == (REPO / "configs" / "tiny.yaml").read_text()
