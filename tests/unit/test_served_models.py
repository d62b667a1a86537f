"""The chat server playing vLLM (tests/served_models.py): a LoRA adapter's answer over HTTP is the in-process
backend's answer with that adapter, and the dynamic LoRA endpoints and model names behave as vLLM's do."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from chat_server import make_app
from loopback_servers import serve
from served_models import ServedModels, TransformersEngine, random_adapter

from mascot.config import SamplingParams
from mascot.llm import OpenAIBackend, TransformersBackend

MESSAGES = [{"role": "system", "content": "You are The Beacon."}, {"role": "user", "content": "I got the job!"}]
PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, chat_template_kwargs={"enable_thinking": False})


def over_http(url: str, model: str, n: int, seed: int) -> list[str]:
    backend = OpenAIBackend(model, base_url=f"{url}/v1", api_key_env="MASCOT_TEST_UNSET_KEY", max_retries=0)
    return asyncio.run(backend.generate(MESSAGES, n, PARAMS, seed))


def in_process(base, adapter, n: int, seed: int) -> list[str]:
    return asyncio.run(TransformersBackend(base, adapter=adapter, device="cpu").generate(MESSAGES, n, PARAMS, seed))


def test_an_adapter_loaded_at_runtime_answers_as_the_in_process_backend_with_that_adapter(tiny_models, tmp_path):
    adapter = random_adapter(tiny_models.lm, tmp_path / "speaker", seed=1)
    served = ServedModels("tiny-lm", root=str(tiny_models.lm), allow_runtime_lora=True,
                          engine=TransformersEngine(tiny_models.lm))
    with serve(make_app(seconds_per_token=0.0, served=served)) as url:
        loaded = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "speaker-1", "lora_path": str(adapter)})
        assert loaded.status_code == 200, loaded.text
        with_adapter = over_http(url, "speaker-1", n=2, seed=7)
        base = over_http(url, "tiny-lm", n=2, seed=7)
    assert with_adapter == in_process(tiny_models.lm, str(adapter), n=2, seed=7)
    assert base == in_process(tiny_models.lm, None, n=2, seed=7)
    assert with_adapter != base  # the adapter, not the base model, answered


def test_the_lora_endpoints_and_model_names_answer_as_vllm_does(tmp_path, tiny_models):
    first, second = random_adapter(tiny_models.lm, tmp_path / "a", 1), random_adapter(tiny_models.lm, tmp_path / "b", 2)
    served = ServedModels("base", allow_runtime_lora=True)
    with serve(make_app(seconds_per_token=0.0, served=served)) as url:
        load = lambda name, path: httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})
        assert load("speaker", first).text == "Success: LoRA adapter 'speaker' added successfully."
        again = load("speaker", second)
        assert again.status_code == 400
        assert again.json()["error"]["message"] == "The lora adapter 'speaker' has already been loaded."
        assert load("other", tmp_path / "nothing").status_code == 404
        assert load("", first).status_code == 400
        cards = httpx.get(f"{url}/v1/models").json()["data"]
        assert [(c["id"], c["root"], c["parent"]) for c in cards] == [("base", "base", None),
                                                                      ("speaker", str(first), "base")]
        unknown = httpx.post(f"{url}/v1/chat/completions", json={"model": "director", "messages": MESSAGES})
        assert unknown.status_code == 404 and "`director` does not exist" in unknown.json()["error"]["message"]
        answer = over_http(url, "speaker", 1, 0)
        # Retrained and served under the same name: the simulated replies follow the adapter's content.
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "speaker"}).status_code == 200
        assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "speaker"}).status_code == 404
        assert load("speaker", second).status_code == 200
        assert over_http(url, "speaker", 1, 0) != answer
        assert httpx.get(f"{url}/stats").json()["by_model"] == {"speaker": 2}  # a refused name is not decoded


@pytest.mark.parametrize("lora_modules", [False, True])
def test_without_runtime_updating_the_lora_endpoints_do_not_exist(tmp_path, tiny_models, lora_modules):
    served = ServedModels("base")
    if lora_modules:  # --lora-modules speaker=... without VLLM_ALLOW_RUNTIME_LORA_UPDATING
        served.add("speaker", random_adapter(tiny_models.lm, tmp_path / "a", 1))
    with serve(make_app(seconds_per_token=0.0, served=served)) as url:
        for endpoint in ("load_lora_adapter", "unload_lora_adapter"):
            refused = httpx.post(f"{url}/v1/{endpoint}", json={"lora_name": "x", "lora_path": str(tmp_path)})
            assert (refused.status_code, refused.json()) == (404, {"detail": "Not Found"})
        assert [card["id"] for card in httpx.get(f"{url}/v1/models").json()["data"]] == \
            ["base", *(["speaker"] if lora_modules else [])]
