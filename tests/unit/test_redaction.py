"""Secrets never leave the process: not in the manifest, the wandb config or an error message.

Validation refuses a key where a variable's name belongs and a URL with credentials (see
test_config_validate.py). These tests build such a config in code, past validation, and check that
what the project writes still masks them.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from mascot.artifacts import RunDir
from mascot.config import SamplingParams
from mascot.llm import BackendUnavailable, MissingAPIKey
from mascot.llm.openai_backend import OpenAIBackend
from mascot.redaction import REDACTED, is_env_var_name, looks_like_secret, redact, redact_text, redact_url

KEY = "sk-proj-Qm4Tn81Lx02Vb66Ws9Hk"
PASSWORD = "hunter2pass"
URL = f"http://admin:{PASSWORD}@127.0.0.1:9/v1"


@pytest.mark.parametrize("value", [KEY, "sk-ant-api03-Ab12Cd34Ef56Gh78", "hf_" + "aB3dE6gH9jK2mN5pQ8sT1vW4",
                                   "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2", "e3b0c44298fc1c149afbf4c8996fb924"])
def test_keys_look_like_secrets(value):
    assert looks_like_secret(value) and not is_env_var_name(value)


@pytest.mark.parametrize("value", ["OPENAI_API_KEY", "VLLM_API_KEY", "GEMINI_API_KEY", "my_key_2024",
                                   "Qwen/Qwen3-8B", "/models/speaker/checkpoint-12345678", "http://127.0.0.1:8000/v1",
                                   "meta-llama/Llama-3.1-8B-Instruct", "paper-emotional-support"])
def test_names_paths_and_urls_do_not(value):
    assert not looks_like_secret(value)


def test_urls_lose_credentials_and_secret_query_values():
    assert redact_url(URL) == f"http://{REDACTED}@127.0.0.1:9/v1"
    assert redact_url("https://h.example/v1?api_key=abc&x=1") == f"https://h.example/v1?api_key={REDACTED}&x=1"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    text = redact_text(f"could not reach {URL} with {KEY}")
    assert PASSWORD not in text and KEY not in text and "127.0.0.1:9" in text


def test_api_key_env_holds_only_names():
    dump = {"generation": {"api_key_env": "my key", "base_url": URL, "model": "m"}, "judges": [{"api_key_env": KEY}]}
    assert redact(dump) == {"generation": {"api_key_env": REDACTED, "base_url": f"http://{REDACTED}@127.0.0.1:9/v1",
                                           "model": "m"}, "judges": [{"api_key_env": REDACTED}]}


@pytest.fixture
def leaky_config(tiny_config, tmp_path):
    """configs/tiny.yaml with a key and a password in it, built in code so validation never saw them."""
    generation = tiny_config.generation.model_copy(update={"kind": "openai", "base_url": URL, "api_key_env": KEY})
    run = tiny_config.run.model_copy(update={"output_dir": tmp_path / "runs"})
    return tiny_config.model_copy(update={"generation": generation, "run": run})


def test_the_manifest_masks_secrets_that_got_past_validation(leaky_config):
    run = RunDir(leaky_config.run_dir)
    run.start(leaky_config)
    text = run.manifest.read_text()
    assert KEY not in text and PASSWORD not in text
    generation = json.loads(text)["config"]["generation"]
    assert generation["api_key_env"] == REDACTED and generation["base_url"].startswith(f"http://{REDACTED}@")


def test_the_wandb_config_masks_them_too(leaky_config, monkeypatch):
    import wandb

    from mascot import tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    with tracking.wandb_run(leaky_config, "redaction"):
        pass
    wandb.teardown()  # finish() may return before wandb's service has flushed the record log; this waits for it
    files = [f for f in (leaky_config.run_dir / "wandb").rglob("*") if f.is_file()]
    for file in files:
        data = file.read_bytes()
        assert KEY.encode() not in data and PASSWORD.encode() not in data, file
    # Offline wandb keeps the config in its binary record log, where strings are plain bytes.
    record = next(f for f in files if f.suffix == ".wandb").read_bytes()
    assert REDACTED.encode() in record and b"api_key_env" in record


def test_backend_errors_show_the_url_without_credentials():
    backend = OpenAIBackend("m", base_url=URL, max_retries=0, timeout_s=2)
    assert PASSWORD not in repr(backend)
    with pytest.raises(BackendUnavailable) as caught:
        asyncio.run(backend.generate([{"role": "user", "content": "hi"}], 1, SamplingParams(), seed=0))
    assert PASSWORD not in str(caught.value) and "127.0.0.1:9" in str(caught.value)


def test_a_missing_key_error_does_not_echo_a_key_named_as_its_variable():
    with pytest.raises(MissingAPIKey) as caught:
        OpenAIBackend("gpt-4o", api_key_env=KEY)
    assert KEY not in str(caught.value) and REDACTED in str(caught.value)


def test_the_cli_masks_secrets_in_any_error(capsys):
    import typer

    from cli.common import fail

    with pytest.raises(typer.Exit):
        fail(f"the server at {URL} refused key {KEY}")
    shown = capsys.readouterr().err
    assert PASSWORD not in shown and KEY not in shown and "127.0.0.1:9" in shown
