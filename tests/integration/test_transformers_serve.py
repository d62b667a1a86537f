"""Sampling K candidates from a real `transformers serve` process through the openai backend and the
request cache, and proving that repeated requests never reach the server.

Requests are counted at the server: uvicorn writes one access-log line per HTTP request it
answers, and the test counts the `POST /v1/chat/completions` lines in the server's log.
`transformers serve` ignores `n`, so every query also exercises the backend's top-up path.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from mascot.config import BackendConfig, SamplingParams
from mascot.data import SAMPLES_DIR, load_contexts
from mascot.llm import CachedBackend, RequestCache, make_backend
from mascot.prompts import speaker_messages
from mascot.roster import load_roster

pytestmark = pytest.mark.integration

K = 4
REPO = Path(__file__).resolve().parents[2]
ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
CONTEXT = load_contexts("empathetic_dialogues", SAMPLES_DIR / "empathetic_dialogues", limit=1)[0]
PERSONAS = {persona_id: speaker_messages(ROSTER.get(persona_id), CONTEXT) for persona_id in ("anchor", "catalyst")}
PARAMS = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=16)


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
