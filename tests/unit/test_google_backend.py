"""The Google backend, through the real `google-genai` SDK, against a loopback server speaking generateContent."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from loopback_servers import free_port, serve

from mascot.config import BackendConfig, SamplingParams
from mascot.data.context import Message
from mascot.llm import (
    BackendRequestError,
    BackendUnavailable,
    CachedBackend,
    GoogleBackend,
    MissingAPIKey,
    RequestCache,
    make_backend,
)

MESSAGES = [{"role": "system", "content": "You are The Beacon."}, {"role": "user", "content": "I feel stuck."}]
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=32)
SCORE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "score", "schema": {"type": "object", "properties": {"overall": {"type": "integer"}}}},
}


@dataclass
class ServerBehaviour:
    """What the fake Gemini API does; reset before every test."""

    max_candidates: int = 8  # answer with at most this many candidates
    refuse_multiple: bool = False  # 400 on candidateCount > 1, as some models do
    fail_first: int = 0  # answer the first requests with this status...
    fail_status: int = 503
    block_prompt: bool = False
    thought_part: bool = False
    delay_s: float = 0.0
    requests: list[dict] = field(default_factory=list)  # path, key, body
    in_flight: int = 0
    max_in_flight: int = 0

    @property
    def bodies(self) -> list[dict]:
        return [r["body"] for r in self.requests]

    @property
    def configs(self) -> list[dict]:
        return [r["body"]["generationConfig"] for r in self.requests]


def error(status: int, state: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": status, "message": message, "status": state}}, status_code=status)


def build_app(behaviour: ServerBehaviour) -> FastAPI:
    app = FastAPI()

    @app.post("/{version}/models/{model_action}")
    async def generate_content(version: str, model_action: str, request: Request):
        body = await request.json()
        key = request.headers.get("x-goog-api-key") or request.query_params.get("key")
        behaviour.requests.append({"path": f"/{version}/models/{model_action}", "key": key, "body": body})
        model, _, action = model_action.partition(":")
        if action != "generateContent":
            return error(404, "NOT_FOUND", f"unknown action {action!r}")
        if not key:
            return error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers")
        if len(behaviour.requests) <= behaviour.fail_first:
            return error(behaviour.fail_status, "UNAVAILABLE" if behaviour.fail_status >= 500 else "INVALID_ARGUMENT",
                         "The model is overloaded." if behaviour.fail_status >= 500 else "Invalid JSON payload.")
        config = body.get("generationConfig", {})
        count = config.get("candidateCount", 1)
        if behaviour.refuse_multiple and count > 1:
            return error(400, "INVALID_ARGUMENT", f"Multiple candidates is not enabled for models/{model}")
        behaviour.in_flight += 1
        behaviour.max_in_flight = max(behaviour.max_in_flight, behaviour.in_flight)
        try:
            await asyncio.sleep(behaviour.delay_s)
        finally:
            behaviour.in_flight -= 1
        usage = {"promptTokenCount": 12, "candidatesTokenCount": 5, "totalTokenCount": 17}
        if behaviour.block_prompt:
            return {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage}
        json_mode = config.get("responseMimeType") == "application/json"
        candidates = []
        for index in range(min(count, behaviour.max_candidates)):
            text = (json.dumps({"overall": 4, "seed": config.get("seed"), "candidate": index}) if json_mode
                    else f"seed={config.get('seed')} candidate={index} END extra")
            parts = [{"text": "Thinking it over.", "thought": True}] if behaviour.thought_part else []
            candidates.append({"content": {"role": "model", "parts": [*parts, {"text": text}]},
                               "finishReason": "STOP", "index": index})
        return {"candidates": candidates, "usageMetadata": usage, "modelVersion": model}

    return app


@pytest.fixture(scope="module")
def server():
    behaviour = ServerBehaviour()
    with serve(build_app(behaviour)) as url:
        yield behaviour, url


@pytest.fixture
def fake(server):
    behaviour, url = server
    behaviour.__init__()  # a fresh behaviour per test, on the same running server
    return behaviour, url


def make(url: str, **options) -> GoogleBackend:
    options = {"timeout_s": 5.0, "max_retries": 2, "retry_delay_s": 0.01, **options}
    return GoogleBackend("gemini-test", base_url=url, api_key_env="MASCOT_TEST_UNSET_KEY", **options)


def test_asks_for_n_candidates_in_one_request_with_all_fields(fake):
    behaviour, url = fake
    backend = make(url)
    texts = asyncio.run(backend.generate(MESSAGES, 3, PARAMS.model_copy(update={"stop": ["END"]}), seed=11))
    assert texts == [f"seed=11 candidate={i}" for i in range(3)]  # cut at the stop string, stripped
    assert backend.requests_sent == 1 and backend.calls_made == 1
    [request] = behaviour.requests
    assert request["path"].endswith("/models/gemini-test:generateContent") and request["key"] == "EMPTY"
    body = request["body"]
    assert body["systemInstruction"]["parts"] == [{"text": "You are The Beacon."}]
    assert body["contents"] == [{"role": "user", "parts": [{"text": "I feel stuck."}]}]
    assert body["generationConfig"] == {"temperature": 0.7, "topP": 0.9, "maxOutputTokens": 32,
                                        "stopSequences": ["END"], "seed": 11, "candidateCount": 3}


def test_roles_map_to_user_and_model_and_consecutive_turns_merge(fake):
    behaviour, url = fake
    messages = [
        Message(role="system", content="Persona."),
        Message(role="user", content="First.", name="Alex"),
        Message(role="user", content="Second."),
        Message(role="assistant", content="Answer."),
        {"role": "system", "content": "Directive."},
        {"role": "user", "content": "Third."},
    ]
    asyncio.run(make(url).generate(messages, 1, PARAMS, seed=0))
    body = behaviour.bodies[0]
    assert body["systemInstruction"]["parts"] == [{"text": "Persona.\n\nDirective."}]
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "First."}, {"text": "Second."}]},
        {"role": "model", "parts": [{"text": "Answer."}]},
        {"role": "user", "parts": [{"text": "Third."}]},
    ]
    assert "candidateCount" not in body["generationConfig"]  # only sent when above 1


def test_tops_up_missing_candidates_with_derived_seeds(fake):
    behaviour, url = fake
    behaviour.max_candidates = 2
    backend = make(url)
    texts = asyncio.run(backend.generate(MESSAGES, 4, PARAMS, seed=100))
    assert texts[:2] == ["seed=100 candidate=0 END extra", "seed=100 candidate=1 END extra"]
    assert sorted(texts[2:]) == ["seed=102 candidate=0 END extra", "seed=103 candidate=0 END extra"]
    assert [c.get("candidateCount") for c in behaviour.configs] == [4, None, None]
    assert backend.requests_sent == 3


def test_more_than_eight_candidates_ask_for_eight_then_top_up(fake):
    behaviour, url = fake
    texts = asyncio.run(make(url).generate(MESSAGES, 10, PARAMS, seed=0))
    assert len(texts) == 10 and texts[8:] == ["seed=8 candidate=0 END extra", "seed=9 candidate=0 END extra"]
    assert behaviour.configs[0]["candidateCount"] == 8 and len(behaviour.requests) == 3


def test_a_model_without_multiple_candidates_gets_one_request_per_candidate(fake):
    behaviour, url = fake
    behaviour.refuse_multiple = True
    backend = make(url)
    texts = asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=5))
    assert sorted(texts) == [f"seed={s} candidate=0 END extra" for s in (5, 6, 7)]
    assert not backend.multi_candidate
    assert len(behaviour.requests) == 4  # the refused request, then one per candidate
    asyncio.run(backend.generate(MESSAGES, 2, PARAMS, seed=0))
    assert len(behaviour.requests) == 6  # remembered: no refused request this time


def test_seeds_stay_within_32_bits(fake):
    behaviour, url = fake
    behaviour.max_candidates = 1
    asyncio.run(make(url).generate(MESSAGES, 2, PARAMS, seed=2**31 - 1))
    assert sorted(c["seed"] for c in behaviour.configs) == [0, 2**31 - 1]


def test_json_schema_becomes_a_response_json_schema(fake):
    behaviour, url = fake
    texts = asyncio.run(make(url).generate(MESSAGES, 2, PARAMS, seed=3, response_format=SCORE_FORMAT))
    assert [json.loads(t) for t in texts] == [{"overall": 4, "seed": 3, "candidate": i} for i in range(2)]
    config = behaviour.configs[0]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == SCORE_FORMAT["json_schema"]["schema"]


def test_json_object_only_sets_the_mime_type_and_thoughts_are_skipped(fake):
    behaviour, url = fake
    behaviour.thought_part = True
    [text] = asyncio.run(make(url).generate(MESSAGES, 1, PARAMS, seed=0, response_format={"type": "json_object"}))
    assert json.loads(text)["overall"] == 4
    config = behaviour.configs[0]
    assert config["responseMimeType"] == "application/json" and "responseJsonSchema" not in config
    with pytest.raises(ValueError, match="not supported"):
        asyncio.run(make(url).generate(MESSAGES, 1, PARAMS, seed=0, response_format={"type": "regex"}))


def test_a_blocked_prompt_gives_empty_texts_without_asking_again(fake):
    behaviour, url = fake
    behaviour.block_prompt = True
    backend = make(url)
    assert asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=0)) == ["", "", ""]
    assert backend.empty_replies == 3 and len(behaviour.requests) == 1


def test_retries_server_errors_then_succeeds(fake):
    behaviour, url = fake
    behaviour.fail_first = 2
    backend = make(url, max_retries=3)
    assert len(asyncio.run(backend.generate(MESSAGES, 2, PARAMS, seed=0))) == 2
    assert len(behaviour.requests) == 3 and backend.requests_sent == 3 and backend.calls_made == 1


def test_gives_up_after_the_retries_with_backend_unavailable(fake):
    behaviour, url = fake
    behaviour.fail_first = 100
    backend = make(url, max_retries=2)
    with pytest.raises(BackendUnavailable, match="HTTP 503: The model is overloaded") as caught:
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert url in str(caught.value)
    assert len(behaviour.requests) == 3  # one try and two retries


def test_client_errors_are_not_retried(fake):
    behaviour, url = fake
    behaviour.fail_first, behaviour.fail_status = 100, 400
    backend = make(url, max_retries=3)
    with pytest.raises(BackendRequestError, match="HTTP 400: Invalid JSON payload"):
        asyncio.run(backend.generate(MESSAGES, 2, PARAMS, seed=0))
    assert len(behaviour.requests) == 1


def test_unreachable_server_names_the_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    backend = make(url, max_retries=1)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="connection failed") as caught:
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert url in str(caught.value)
    assert backend.requests_sent == 2  # the try and one retry
    assert time.monotonic() - started < 5


def test_timeout_is_reported_as_unavailable(fake):
    behaviour, url = fake
    behaviour.delay_s = 1.5
    backend = make(url, timeout_s=0.3, max_retries=0)
    with pytest.raises(BackendUnavailable, match=r"no answer within 0.3 s"):
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))


def test_concurrency_is_limited(fake):
    behaviour, url = fake
    behaviour.delay_s = 0.05
    backend = make(url, max_concurrency=2)

    async def many():
        return await asyncio.gather(*(backend.generate(MESSAGES, 1, PARAMS, seed=s) for s in range(5)))

    assert len(asyncio.run(many())) == 5
    assert behaviour.max_in_flight == 2


def test_api_key_rules(monkeypatch, fake):
    behaviour, url = fake
    for name in ("GOOGLE_API_KEY", "GEMINI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(MissingAPIKey, match="GOOGLE_API_KEY or GEMINI_API_KEY"):
        GoogleBackend("gemini-test")
    with pytest.raises(MissingAPIKey, match="MASCOT_TEST_KEY"):
        GoogleBackend("gemini-test", base_url="https://generativelanguage.googleapis.com",
                      api_key_env="MASCOT_TEST_KEY")
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-secret")
    backend = GoogleBackend("gemini-test", base_url=url)
    assert "gemini-secret" not in repr(backend) and "gemini-secret" not in str(vars(backend))
    asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert behaviour.requests[0]["key"] == "gemini-secret"


def test_make_backend_maps_the_default_key_variable_and_caches(fake, tmp_path, monkeypatch):
    behaviour, url = fake
    monkeypatch.setenv("GOOGLE_API_KEY", "google-from-default-variable")
    cache = RequestCache(tmp_path / "requests.sqlite")
    config = BackendConfig(kind="google", model="gemini-test", base_url=url, timeout_s=5, max_retries=1)
    backend = make_backend(config, cache=cache)
    assert isinstance(backend, CachedBackend) and backend.kind == "google"
    first = asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=1))
    assert asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=1)) == first
    assert len(behaviour.requests) == 1 and cache.stats().hits == 1  # the second call made no request
    assert behaviour.requests[0]["key"] == "google-from-default-variable"
    cache.close()
    for file in tmp_path.iterdir():
        assert b"google-from-default-variable" not in file.read_bytes()
