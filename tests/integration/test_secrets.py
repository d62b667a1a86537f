"""API keys reach the API and nothing else: a Stage 1 run with an API generator and an API judge, each with a fake
key in the environment, against a loopback server that refuses any other key. Then every place a run writes is
searched for the keys: the process's output, the Prefect server's flow runs (their parameters), task runs, logs
and artifacts read through its API, every file of the run directory (manifest and wandb's offline files
included), the request cache, and wandb's folder."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import yaml
from chat_server import make_app
from loopback_servers import serve
from test_flow_engine import http_config, mascot

pytestmark = pytest.mark.integration

# Shaped like real keys, so that anything that masks keys by their look would have to mask these too.
KEYS = {"MASCOT_SECRET_GENERATION": "sk-proj-GenerationSecret7Q2xT9vLmB4nK8wZ",
        "MASCOT_SECRET_JUDGE": "sk-proj-JudgeSecret3Hf6Rp1cYs5Dd0UqJe"}


def prefect_records(api: str) -> dict[str, str]:
    """What the Prefect server holds about runs, as the JSON its API returns."""
    read = {name: httpx.post(f"{api}/{name}/filter", json={"limit": 200}) for name in
            ("flow_runs", "task_runs", "artifacts", "logs")}
    return {name: answer.raise_for_status().text for name, answer in read.items()}


def files_under(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and not path.is_symlink()]


def test_api_keys_appear_nowhere_but_in_the_requests(tmp_path, prefect_api, monkeypatch):
    app = make_app(seconds_per_token=0.001, api_keys=set(KEYS.values()))
    with serve(app) as url:
        config = http_config(tmp_path, "secrets", url, contexts=4)
        settings = yaml.safe_load(config.read_text())
        settings["generation"]["api_key_env"] = "MASCOT_SECRET_GENERATION"
        settings["stage1"]["judges"] = [{"kind": "llm", "name": "api-judge", "backend": {
            "kind": "openai", "model": "sim-judge", "base_url": f"{url}/v1", "api_key_env": "MASCOT_SECRET_JUDGE",
            "params": {"temperature": 0.0, "max_new_tokens": 64}}}]
        config.write_text(yaml.safe_dump(settings, sort_keys=False))
        for name, key in KEYS.items():
            monkeypatch.setenv(name, key)
        done = mascot(config, "secrets", prefect_api)
        authorized = app.state.stats.authorized
    assert set(authorized) == set(KEYS.values()) and all(authorized.values()), "each key was used, by its role"

    run, cache = tmp_path / "runs" / "secrets", tmp_path / "secrets-cache"
    places = {"the run's output": done.stdout + done.stderr}
    places |= {f"Prefect's {name}": text for name, text in prefect_records(prefect_api).items()}
    searched = [*files_under(run), *files_under(cache), *files_under(Path(os.environ["WANDB_DIR"]))]
    assert any(path.name == "manifest.json" for path in searched)
    assert any(path.name.startswith("requests.sqlite") for path in searched)
    assert any(path.suffix == ".wandb" for path in searched), "the run logged to wandb offline"
    for name, key in KEYS.items():
        for where, text in places.items():
            assert key not in text and key[8:24] not in text, f"{name}'s key is in {where}"
        for path in searched:
            data = path.read_bytes()
            assert key.encode() not in data and key[8:24].encode() not in data, f"{name}'s key is in {path}"
    assert "MASCOT_SECRET_JUDGE" in (run / "manifest.json").read_text(), "the manifest names the variable, not its key"
