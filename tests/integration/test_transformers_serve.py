"""Sampling K candidates from a real `transformers serve` process through the openai backend and the
request cache, and proving that repeated requests never reach the server.

Requests are counted at the server: uvicorn writes one access-log line per HTTP request it
answers, and the test counts the `POST /v1/chat/completions` lines in the server's log.
`transformers serve` ignores `n`, so every query also exercises the backend's top-up path.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mascot.config import BackendConfig, SamplingParams
from mascot.data import SAMPLES_DIR, load_contexts
from mascot.llm import CachedBackend, RequestCache, make_backend
from mascot.prompts import speaker_messages
from mascot.roster import load_roster

pytestmark = pytest.mark.integration

K = 4
STARTUP_TIMEOUT_S = 120
CHAT_REQUEST_LINE = '"POST /v1/chat/completions HTTP/1.1" 200'
REPO = Path(__file__).resolve().parents[2]
ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
CONTEXT = load_contexts("empathetic_dialogues", SAMPLES_DIR / "empathetic_dialogues", limit=1)[0]
PERSONAS = {persona_id: speaker_messages(ROSTER.get(persona_id), CONTEXT) for persona_id in ("anchor", "catalyst")}
PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerLog:
    def __init__(self, path: Path):
        self.path = path

    def text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def chat_requests(self) -> int:
        return self.text().count(CHAT_REQUEST_LINE)

    def wait_for_chat_requests(self, expected: int, timeout_s: float = 5.0) -> int:
        """The count once it reaches `expected` (or whatever it is at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.chat_requests() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.chat_requests()


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    """`transformers serve` pinned to the tiny LM on a free loopback port; yields (model, url, log)."""
    model = str(tiny_models.lm)
    port = free_port()
    log = ServerLog(tmp_path_factory.mktemp("transformers-serve") / "server.log")
    # Unbuffered, so uvicorn's access lines (on stdout) reach the log as each request is answered.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", model,
               "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with log.path.open("wb") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_until_healthy(server, f"http://127.0.0.1:{port}/health", log)
        yield model, f"http://127.0.0.1:{port}/v1", log
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)


def _wait_until_healthy(server: subprocess.Popen, health_url: str, log: ServerLog) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"transformers serve exited with code {server.returncode}; its log:\n{log.text()[-4000:]}")
        try:
            with urllib.request.urlopen(health_url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"transformers serve did not answer {health_url} within {STARTUP_TIMEOUT_S} s; "
                f"its log:\n{log.text()[-4000:]}")


def sample_personas(backend) -> dict[str, list[str]]:
    async def run():
        replies = await asyncio.gather(*(
            backend.generate(messages, K, PARAMS, seed=0) for messages in PERSONAS.values()
        ))
        return dict(zip(PERSONAS, replies))

    return asyncio.run(run())


def test_candidates_are_sampled_once_and_then_served_from_the_request_cache(served, tmp_path):
    model, url, log = served
    config = BackendConfig(kind="openai", model=model, base_url=url, api_key_env="MASCOT_TEST_UNSET_KEY",
                           timeout_s=60, max_retries=1, max_concurrency=4, params=PARAMS)
    cache_path = tmp_path / "requests.sqlite"
    backend = make_backend(config, cache=RequestCache(cache_path))
    assert isinstance(backend, CachedBackend)
    before = log.chat_requests()

    first = sample_personas(backend)
    for texts in first.values():
        assert len(texts) == K and all(isinstance(text, str) for text in texts)
        assert len(set(texts)) > 1, "candidates should be distinct samples (distinct top-up seeds)"
    # The server answers one choice per request: 1 request for n=K plus K-1 top-ups, per persona.
    expected = len(PERSONAS) * K
    assert backend.backend.requests_sent == expected
    assert log.wait_for_chat_requests(before + expected) == before + expected

    # The same requests again, from this backend and from a fresh one on the same cache file (a
    # restarted run): identical texts, and the server sees nothing.
    again = sample_personas(backend)
    restarted = make_backend(config, cache=RequestCache(cache_path))
    after_restart = sample_personas(restarted)
    assert again == first and after_restart == first
    time.sleep(0.5)  # let any stray request reach the log before counting
    assert log.chat_requests() == before + expected
    assert backend.backend.requests_sent == expected and restarted.backend.requests_sent == 0
    assert backend.cache.stats().as_dict() == {"hits": 2, "misses": 2, "lookups": 4, "hit_rate": 0.5}
    assert restarted.cache.stats().hits == 2
