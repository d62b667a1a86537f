"""The Anthropic backend, through the real `anthropic` SDK, against a loopback server speaking the Messages API."""

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
    AnthropicBackend,
    BackendRequestError,
    BackendUnavailable,
    CachedBackend,
    MissingAPIKey,
    RequestCache,
    make_backend,
)

MESSAGES = [{"role": "system", "content": "You are The Anchor."}, {"role": "user", "content": "I feel stuck."}]
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=32)
SCORE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "score", "strict": True,
                    "schema": {"type": "object", "properties": {"overall": {"type": "integer"}}}},
}


@dataclass
class ServerBehaviour:
    """What the fake Messages API does; reset before every test."""

    fail_first: int = 0  # answer the first requests with this status...
    fail_status: int = 529
    refuse_temperature: bool = False  # what the newest models do
    thinking_block: bool = False
    empty_content: bool = False
    delay_s: float = 0.0
    bodies: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def api_key_of(headers) -> str | None:
    # anthropic 2.x sends the key as a bearer token; older SDKs (and the API docs) use x-api-key.
    bearer = headers.get("authorization", "")
    return headers.get("x-api-key") or (bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None)


def error(status: int, kind: str, message: str) -> JSONResponse:
    # retry-after-ms keeps the SDK's backoff short in tests; the SDK honours it.
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status,
                        headers={"retry-after-ms": "10"})


def build_app(behaviour: ServerBehaviour) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/messages")
    async def messages(request: Request):
        body = await request.json()
        behaviour.bodies.append(body)
        behaviour.headers.append(dict(request.headers))
        if not api_key_of(request.headers) or "anthropic-version" not in request.headers:
            return error(401, "authentication_error", "an API key and the anthropic-version header are required")
        if len(behaviour.bodies) <= behaviour.fail_first:
            return error(behaviour.fail_status, "overloaded_error" if behaviour.fail_status == 529 else "invalid_request_error",
                         "Overloaded" if behaviour.fail_status >= 500 else "messages: bad request")
        if behaviour.refuse_temperature and "temperature" in body:
            return error(400, "invalid_request_error", "temperature is deprecated for this model.")
        number = len(behaviour.bodies)  # before the await: requests run concurrently
        behaviour.in_flight += 1
        behaviour.max_in_flight = max(behaviour.max_in_flight, behaviour.in_flight)
        try:
            await asyncio.sleep(behaviour.delay_s)
        finally:
            behaviour.in_flight -= 1
        content: list[dict] = []
        if behaviour.thinking_block:
            content.append({"type": "thinking", "thinking": "Let me think.", "signature": "sig"})
        choice = body.get("tool_choice")
        if choice and choice.get("type") == "tool":
            content.append({"type": "tool_use", "id": f"toolu_{number}", "name": choice["name"],
                            "input": {"overall": 4, "request": number}})
            stop_reason = "tool_use"
        elif not behaviour.empty_content:
            content += [{"type": "text", "text": f"reply {number} "}, {"type": "text", "text": "END extra"}]
            stop_reason = "end_turn"
        else:
            stop_reason = "refusal"
        return {"id": f"msg_{number}", "type": "message", "role": "assistant", "model": body["model"],
                "content": content, "stop_reason": stop_reason, "stop_sequence": None,
                "usage": {"input_tokens": 12, "output_tokens": 5}}

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


def make(url: str, **options) -> AnthropicBackend:
    options = {"timeout_s": 5.0, "max_retries": 2, **options}
    return AnthropicBackend("claude-test", base_url=url, api_key_env="MASCOT_TEST_UNSET_KEY", **options)


def test_sends_a_messages_request_with_the_system_prompt_on_top(fake):
    behaviour, url = fake
    backend = make(url)
    texts = asyncio.run(backend.generate(MESSAGES, 1, PARAMS.model_copy(update={"stop": ["END"]}), seed=7))
    assert texts == ["reply 1"]  # text blocks joined, cut at the stop string, stripped
    body, headers = behaviour.bodies[0], behaviour.headers[0]
    assert body["system"] == "You are The Anchor."
    assert body["messages"] == [{"role": "user", "content": "I feel stuck."}]
    assert (body["model"], body["max_tokens"], body["stop_sequences"]) == ("claude-test", 32, ["END"])
    assert body["temperature"] == 0.7
    assert not {"top_p", "n", "seed", "tools", "tool_choice"} & body.keys()
    assert api_key_of(headers) == "EMPTY" and headers["anthropic-version"]
    assert backend.requests_sent == 1 and backend.calls_made == 1


def test_several_system_messages_and_consecutive_turns_are_kept_in_order(fake):
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
    assert body["system"] == "Persona.\n\nDirective."
    # The API combines consecutive same-role turns itself, so they go as they are (without `name`).
    assert body["messages"] == [{"role": "user", "content": "First."}, {"role": "user", "content": "Second."},
                                {"role": "assistant", "content": "Answer."}, {"role": "user", "content": "Third."}]


def test_default_temperature_and_whitespace_stops_are_left_out_but_stops_still_cut(fake):
    behaviour, url = fake
    params = SamplingParams(max_new_tokens=16, stop=["\n\n", " extra"])
    assert asyncio.run(make(url).generate(MESSAGES, 1, params, seed=0)) == ["reply 1 END"]
    body = behaviour.bodies[0]
    assert "temperature" not in body and body["stop_sequences"] == [" extra"]


def test_n_candidates_are_n_concurrent_requests(fake):
    behaviour, url = fake
    behaviour.delay_s = 0.05
    backend = make(url, max_concurrency=3)
    texts = asyncio.run(backend.generate(MESSAGES, 5, PARAMS, seed=0))
    assert sorted(texts) == sorted(f"reply {i} END extra" for i in range(1, 6))
    assert len(behaviour.bodies) == 5 and backend.requests_sent == 5
    assert behaviour.max_in_flight == 3
    assert all(body == behaviour.bodies[0] for body in behaviour.bodies)  # no seed to vary


def test_json_schema_becomes_a_forced_tool_call(fake):
    behaviour, url = fake
    texts = asyncio.run(make(url).generate(MESSAGES, 2, PARAMS, seed=0, response_format=SCORE_FORMAT))
    assert sorted(json.loads(t)["request"] for t in texts) == [1, 2]
    assert all(json.loads(t)["overall"] == 4 for t in texts)
    body = behaviour.bodies[0]
    [tool] = body["tools"]
    assert tool["name"] == "score" and tool["strict"] is True
    assert tool["input_schema"] == SCORE_FORMAT["json_schema"]["schema"]
    assert body["tool_choice"] == {"type": "tool", "name": "score"}


def test_json_object_forces_a_generic_object_tool_and_thinking_is_skipped(fake):
    behaviour, url = fake
    behaviour.thinking_block = True
    [text] = asyncio.run(make(url).generate(MESSAGES, 1, PARAMS, seed=0, response_format={"type": "json_object"}))
    assert json.loads(text) == {"overall": 4, "request": 1}
    assert behaviour.bodies[0]["tools"][0]["input_schema"] == {"type": "object"}
    with pytest.raises(ValueError, match="not supported"):
        asyncio.run(make(url).generate(MESSAGES, 1, PARAMS, seed=0, response_format={"type": "regex"}))


def test_replies_without_text_become_empty_strings(fake):
    behaviour, url = fake
    behaviour.empty_content = True
    backend = make(url)
    assert asyncio.run(backend.generate(MESSAGES, 2, PARAMS, seed=0)) == ["", ""]
    assert backend.empty_replies == 2


def test_a_model_that_refuses_temperature_is_asked_again_without_it(fake):
    behaviour, url = fake
    behaviour.refuse_temperature = True
    backend = make(url)
    assert asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0)) == ["reply 2 END extra"]
    assert ["temperature" in body for body in behaviour.bodies] == [True, False]
    assert not backend.sends_temperature
    asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=1))
    assert len(behaviour.bodies) == 3 and "temperature" not in behaviour.bodies[2]  # remembered


def test_retries_overloaded_then_succeeds(fake):
    behaviour, url = fake
    behaviour.fail_first = 2  # 529: Anthropic's "overloaded"
    backend = make(url, max_retries=3)
    assert asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0)) == ["reply 3 END extra"]
    assert len(behaviour.bodies) == 3 and backend.requests_sent == 3 and backend.calls_made == 1


def test_gives_up_after_the_retries_with_backend_unavailable(fake):
    behaviour, url = fake
    behaviour.fail_first, behaviour.fail_status = 100, 503
    backend = make(url, max_retries=2)
    with pytest.raises(BackendUnavailable, match="HTTP 503: Overloaded") as caught:
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert url in str(caught.value)
    assert len(behaviour.bodies) == 3  # one try and two retries


def test_client_errors_are_not_retried(fake):
    behaviour, url = fake
    behaviour.fail_first, behaviour.fail_status = 100, 400
    backend = make(url, max_retries=3)
    with pytest.raises(BackendRequestError, match="HTTP 400: messages: bad request"):
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert len(behaviour.bodies) == 1


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
    behaviour.delay_s = 1.0
    backend = make(url, timeout_s=0.3, max_retries=0)
    with pytest.raises(BackendUnavailable, match=r"no answer within 0.3 s"):
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))


def test_api_key_rules(monkeypatch, fake):
    behaviour, url = fake
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(MissingAPIKey, match="ANTHROPIC_API_KEY"):
        AnthropicBackend("claude-test")
    with pytest.raises(MissingAPIKey, match="MASCOT_TEST_KEY"):
        AnthropicBackend("claude-test", base_url="https://api.anthropic.com", api_key_env="MASCOT_TEST_KEY")
    monkeypatch.setenv("MASCOT_TEST_KEY", "sk-ant-secret")
    backend = AnthropicBackend("claude-test", base_url=url, api_key_env="MASCOT_TEST_KEY")
    assert "sk-ant-secret" not in repr(backend) and "sk-ant-secret" not in str(vars(backend))
    asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert api_key_of(behaviour.headers[0]) == "sk-ant-secret"


def test_make_backend_reads_the_vendor_key_variable_and_caches(fake, tmp_path, monkeypatch):
    behaviour, url = fake
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-default-variable")
    cache = RequestCache(tmp_path / "requests.sqlite")
    config = BackendConfig(kind="anthropic", model="claude-test", base_url=url, timeout_s=5, max_retries=1)
    assert config.api_key_env is None  # no variable named: the vendor's own (ANTHROPIC_API_KEY) is read
    backend = make_backend(config, cache=cache)
    assert isinstance(backend, CachedBackend) and backend.kind == "anthropic"
    first = asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=1))
    assert asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=1)) == first
    assert len(behaviour.bodies) == 3 and cache.stats().hits == 1  # the second call made no request
    assert api_key_of(behaviour.headers[0]) == "sk-ant-from-default-variable"
    cache.close()
    for file in tmp_path.iterdir():
        assert b"sk-ant-from-default-variable" not in file.read_bytes()
