"""The OpenAI-compatible backend against a real loopback HTTP server speaking the chat-completions format."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mascot.config import BackendConfig, SamplingParams
from mascot.data.context import Message
from mascot.llm import (
    BackendRequestError,
    BackendUnavailable,
    CachedBackend,
    MissingAPIKey,
    RequestCache,
    make_backend,
    run_requests,
)
from mascot.llm.openai_backend import OpenAIBackend

MESSAGES = [{"role": "system", "content": "You are The Catalyst."}, {"role": "user", "content": "I feel stuck."}]
PARAMS = SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=32)


@dataclass
class ServerBehaviour:
    """What the fake server does; reset before every test."""

    max_choices: int | None = None  # answer with at most this many choices (None: honour n)
    fail_first: int = 0  # answer the first requests with this status...
    fail_status: int = 503
    fail_headers: dict = field(default_factory=lambda: {"retry-after-ms": "10"})
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of every request
    delay_s: float = 0.0
    null_content: bool = False
    bodies: list[dict] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def build_app(behaviour: ServerBehaviour) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await request.json()
        behaviour.bodies.append(body)
        behaviour.arrivals.append(time.monotonic())
        if len(behaviour.bodies) <= behaviour.fail_first:
            # retry-after-ms keeps the client's backoff short in tests; the client honours it.
            return JSONResponse({"error": {"message": "server busy"}}, status_code=behaviour.fail_status,
                                headers=behaviour.fail_headers)
        behaviour.in_flight += 1
        behaviour.max_in_flight = max(behaviour.max_in_flight, behaviour.in_flight)
        try:
            await asyncio.sleep(behaviour.delay_s)
        finally:
            behaviour.in_flight -= 1
        n = body.get("n", 1)
        count = n if behaviour.max_choices is None else min(n, behaviour.max_choices)
        choices = [
            {
                "index": i,
                "finish_reason": "stop",
                "message": {"role": "assistant",
                            "content": None if behaviour.null_content else f"seed={body['seed']} choice={i} END extra"},
            }
            for i in range(count)
        ]
        return {"id": "cmpl-test", "object": "chat.completion", "created": 0, "model": body["model"], "choices": choices}

    return app


@pytest.fixture(scope="module")
def server():
    behaviour = ServerBehaviour()
    port = free_port()
    uvicorn_server = uvicorn.Server(uvicorn.Config(build_app(behaviour), host="127.0.0.1", port=port,
                                                   log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uvicorn_server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not uvicorn_server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    yield behaviour, f"http://127.0.0.1:{port}/v1"
    uvicorn_server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def fake(server):
    behaviour, url = server
    behaviour.__init__()  # a fresh behaviour per test, on the same running server
    return behaviour, url


def make(url: str, **options) -> OpenAIBackend:
    options = {"timeout_s": 5.0, "max_retries": 2, **options}
    return OpenAIBackend("served-model", base_url=url, api_key_env="MASCOT_TEST_UNSET_KEY", **options)


def test_asks_for_n_in_one_request_with_all_sampling_fields(fake):
    behaviour, url = fake
    backend = make(url)
    texts = asyncio.run(backend.generate(MESSAGES, 4, PARAMS.model_copy(update={"stop": ["END"]}), seed=11))
    assert texts == [f"seed=11 choice={i}" for i in range(4)]  # cut at the stop string, stripped
    assert backend.requests_sent == 1 and len(behaviour.bodies) == 1
    body = behaviour.bodies[0]
    assert body["n"] == 4 and body["seed"] == 11 and body["model"] == "served-model"
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["stop"]) == (0.8, 0.9, 32, ["END"])
    assert body["messages"] == MESSAGES and "response_format" not in body
    # Unset, top_k and min_p are not sent: the server's default applies (vLLM's own under --generation-config vllm)
    assert "top_k" not in body and "min_p" not in body


def test_top_k_and_min_p_reach_the_server_in_the_request_body(fake):
    """As vLLM reads them: top-level fields of the body (the SDK's extra_body), beside chat_template_kwargs."""
    behaviour, url = fake
    params = PARAMS.model_copy(update={"top_k": 20, "min_p": 0.05, "chat_template_kwargs": {"enable_thinking": False}})
    asyncio.run(make(url).generate(MESSAGES, 2, params, seed=3))
    body = behaviour.bodies[0]
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (0.8, 0.9, 20, 0.05)
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_tops_up_with_derived_seeds_when_the_server_ignores_n(fake):
    behaviour, url = fake
    behaviour.max_choices = 1  # what `transformers serve` does
    backend = make(url)
    messages = [Message(role="user", content="I feel stuck.")]  # pydantic messages are accepted too
    texts = asyncio.run(backend.generate(messages, 4, PARAMS, seed=100))
    assert texts == [f"seed={100 + i} choice=0 END extra" for i in range(4)]
    assert backend.requests_sent == 4
    assert [b["n"] for b in behaviour.bodies] == [4, 1, 1, 1]
    assert sorted(b["seed"] for b in behaviour.bodies[1:]) == [101, 102, 103]
    assert behaviour.bodies[0]["messages"] == [{"role": "user", "content": "I feel stuck."}]


def test_a_partial_answer_is_topped_up_for_the_missing_candidates_only(fake):
    behaviour, url = fake
    behaviour.max_choices = 2
    backend = make(url)
    texts = asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=0))
    assert len(texts) == 3 and texts[2] == "seed=2 choice=0 END extra"
    assert [b["seed"] for b in behaviour.bodies] == [0, 2]


def test_retries_server_errors_then_succeeds(fake):
    behaviour, url = fake
    behaviour.fail_first = 2
    backend = make(url, max_retries=3)
    texts = asyncio.run(backend.generate(MESSAGES, 2, PARAMS, seed=0))
    assert len(texts) == 2
    assert len(behaviour.bodies) == 3 and backend.requests_sent == 3 and backend.calls_made == 1


def test_gives_up_after_the_retries_with_backend_unavailable(fake):
    behaviour, url = fake
    behaviour.fail_first = 100
    backend = make(url, max_retries=2)
    with pytest.raises(BackendUnavailable, match="HTTP 503") as caught:
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert url in str(caught.value)
    assert len(behaviour.bodies) == 3  # one try and two retries


def test_a_rate_limit_is_retried_past_max_retries_while_the_time_budget_lasts(fake):
    """Sustained 429s are the API's way of saying 'later': a count of retries would fail the run, a budget in
    time waits as long as it was given."""
    behaviour, url = fake
    behaviour.fail_first, behaviour.fail_status, behaviour.fail_headers = 6, 429, {"retry-after": "0"}
    backend = make(url, max_retries=1, retry_budget_s=30)
    assert len(asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))) == 1
    assert len(behaviour.bodies) == 7 and backend.requests_sent == 7  # six 429s, then the answer


@pytest.mark.parametrize("header", ["seconds", "http-date"])
def test_retry_after_is_waited_in_seconds_or_as_an_http_date(fake, header):
    from email.utils import format_datetime

    behaviour, url = fake
    # An HTTP date has whole seconds, so 2 s ahead is a wait of more than 1 s and at most 2 s.
    value = "1" if header == "seconds" else format_datetime(datetime.now(UTC) + timedelta(seconds=2),
                                                             usegmt=True)
    behaviour.fail_first, behaviour.fail_status, behaviour.fail_headers = 1, 429, {"retry-after": value}
    asyncio.run(make(url, max_retries=0, retry_budget_s=30).generate(MESSAGES, 1, PARAMS, seed=0))
    assert len(behaviour.arrivals) == 2
    assert 0.95 <= behaviour.arrivals[1] - behaviour.arrivals[0] < 2.9


def test_a_rate_limit_past_the_budget_fails_with_the_time_it_had(fake):
    behaviour, url = fake
    behaviour.fail_first, behaviour.fail_status, behaviour.fail_headers = 100, 429, {"retry-after": "1"}
    backend = make(url, max_retries=0, retry_budget_s=2.5)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"kept rate-limiting .* after 2 retries in 2\.\d s .*HTTP 429.*"
                                                 r"retry budget being 2.5 s: raise the backend's retry_budget_s"):
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    # tries at 0, 1 and 2 s; a third wait would end at 3 s, past the budget, so it is not waited
    assert len(behaviour.bodies) == 3 and time.monotonic() - started < 2.9


def test_retry_after_is_read_as_seconds_milliseconds_or_an_http_date():
    from mascot.llm.retries import retry_after_s

    now = datetime(2026, 12, 6, 5, 0, 0, tzinfo=UTC)
    assert retry_after_s({"retry-after": "7"}, now) == 7.0
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "7"}, now) == 0.25
    assert retry_after_s({"retry-after": "Sun, 06 Dec 2026 05:00:30 GMT"}, now) == 30.0
    assert retry_after_s({"retry-after": "Sun, 06 Dec 2026 04:59:00 GMT"}, now) == 0.0  # already past
    assert retry_after_s({"retry-after": "soon"}, now) is None and retry_after_s({}, now) is None


def test_client_errors_are_not_retried(fake):
    behaviour, url = fake
    behaviour.fail_first, behaviour.fail_status = 100, 400
    backend = make(url, max_retries=3)
    with pytest.raises(BackendRequestError, match="HTTP 400.*server busy"):
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))
    assert len(behaviour.bodies) == 1


def test_unreachable_server_names_the_url_and_how_to_start_one():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    backend = make(url, max_retries=1)
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        asyncio.run(backend.generate(MESSAGES, 2, PARAMS, seed=0))
    message = str(caught.value)
    assert url in message and "vllm serve served-model" in message and "transformers serve served-model" in message
    assert backend.requests_sent == 2  # the try and one retry
    assert time.monotonic() - started < 5


def test_timeout_is_reported_as_unavailable(fake):
    behaviour, url = fake
    behaviour.delay_s = 1.0
    backend = make(url, timeout_s=0.3, max_retries=0)
    with pytest.raises(BackendUnavailable, match=r"no answer within 0.3 s"):
        asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=0))


def test_concurrency_is_limited(fake):
    behaviour, url = fake
    behaviour.delay_s = 0.1
    backend = make(url, max_concurrency=2)

    async def many():
        return await asyncio.gather(*(backend.generate(MESSAGES, 1, PARAMS, seed=s) for s in range(6)))

    assert len(asyncio.run(many())) == 6
    assert behaviour.max_in_flight == 2


def test_a_failed_shard_lets_its_sent_requests_finish_into_the_cache_and_sends_no_more(fake, tmp_path):
    behaviour, url = fake
    behaviour.delay_s = 0.4
    cache = RequestCache(tmp_path / "requests.sqlite")
    backend = CachedBackend(make(url, max_concurrency=2), cache)

    async def shard(failing: bool):
        async def unreadable():
            await asyncio.sleep(0.1)  # two requests are on the wire, three queued
            if failing:
                raise ValueError("a reply that cannot be read")

        return await asyncio.gather(unreadable(), *(backend.generate(MESSAGES, 1, PARAMS, seed=s) for s in range(5)))

    with pytest.raises(ValueError, match="cannot be read"):
        run_requests(shard(failing=True))
    assert len(behaviour.bodies) == 2  # the queued three were never sent...
    assert len(cache) == 2  # ...and both answers already on their way were kept, not paid for again by a resume
    assert backend.backend._limit().held == 0
    assert len(run_requests(shard(failing=False))) == 6  # the resume pays for the other three only
    assert len(behaviour.bodies) == 5 and cache.hits == 2


def test_forwards_response_format_and_maps_null_content_to_empty_text(fake):
    behaviour, url = fake
    behaviour.null_content = True
    backend = make(url)
    schema = {"type": "json_schema", "json_schema": {"name": "score", "schema": {"type": "object"}}}
    assert asyncio.run(backend.generate(MESSAGES, 2, PARAMS, seed=0, response_format=schema)) == ["", ""]
    assert behaviour.bodies[0]["response_format"] == schema
    assert backend.empty_replies == 2


def test_the_same_backend_serves_several_event_loops(fake):
    _, url = fake
    backend = make(url)
    first = asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=5))
    assert asyncio.run(backend.generate(MESSAGES, 1, PARAMS, seed=5)) == first


def test_api_key_rules(monkeypatch):
    monkeypatch.delenv("MASCOT_TEST_KEY", raising=False)
    with pytest.raises(MissingAPIKey, match="MASCOT_TEST_KEY"):
        OpenAIBackend("gpt-4.1-mini", api_key_env="MASCOT_TEST_KEY")
    with pytest.raises(MissingAPIKey, match="MASCOT_TEST_KEY"):
        OpenAIBackend("gpt-4.1-mini", base_url="https://api.openai.com/v1", api_key_env="MASCOT_TEST_KEY")
    OpenAIBackend("local", base_url="http://127.0.0.1:8000/v1", api_key_env="MASCOT_TEST_KEY")  # dummy key
    monkeypatch.setenv("MASCOT_TEST_KEY", "sk-test-secret")
    backend = OpenAIBackend("gpt-4.1-mini", api_key_env="MASCOT_TEST_KEY")
    assert "sk-test-secret" not in repr(backend) and "sk-test-secret" not in str(vars(backend))


def test_cached_requests_skip_the_server_and_never_store_the_key(fake, tmp_path, monkeypatch):
    behaviour, url = fake
    monkeypatch.setenv("MASCOT_TEST_KEY", "sk-never-on-disk")
    cache = RequestCache(tmp_path / "requests.sqlite")
    config = BackendConfig(kind="openai", model="served-model", base_url=url, api_key_env="MASCOT_TEST_KEY",
                           timeout_s=5, max_retries=1, max_concurrency=3)
    backend = make_backend(config, cache=cache)
    assert isinstance(backend, CachedBackend) and backend.model == "served-model"
    first = asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=1))
    assert asyncio.run(backend.generate(MESSAGES, 3, PARAMS, seed=1)) == first
    assert len(behaviour.bodies) == 1 and cache.stats().hits == 1
    cache.close()
    for file in tmp_path.iterdir():
        assert b"sk-never-on-disk" not in file.read_bytes()
    with sqlite3.connect(tmp_path / "requests.sqlite") as connection:
        assert "sk-never-on-disk" not in str(connection.execute("SELECT * FROM requests").fetchall())


def test_only_the_vendors_apis_need_a_pinned_snapshot():
    """A server of the run's own names its model as it was started; the vendors' aliases move under the cache."""
    from mascot.config.backends import moving_alias_problem

    assert BackendConfig(kind="openai", model="gpt-4o", base_url="http://127.0.0.1:8000/v1").model == "gpt-4o"
    assert BackendConfig(kind="openai", model="gpt-4o-2024-08-06").model == "gpt-4o-2024-08-06"
    with pytest.raises(ValueError, match="moving alias"):
        BackendConfig(kind="openai", model="gpt-4o", base_url="https://api.openai.com/v1")
    assert moving_alias_problem("anthropic", "claude-sonnet-4-5-20250929") is None
    assert moving_alias_problem("google", "gemini-2.0-flash-001") is None
    assert "moving alias" in moving_alias_problem("google", "gemini-2.5-pro-latest")
