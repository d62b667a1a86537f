"""Streaming a reply: its deltas add up to the text `generate` returns for the same request, on the in-process
backend (whatever else shares its batch) and on an OpenAI-compatible server; closing a stream early stops its
generation."""

from __future__ import annotations

import asyncio
import random

import pytest
from chat_server import make_app
from loopback_servers import serve
from test_transformers_backend import PARAMS, PROMPTS, forward_passes

from mascot.config import BackendConfig, SamplingParams
from mascot.llm import make_backend
from mascot.llm.streaming import ReplyDeltas, stream_reply


def deltas_of(snapshots: list[str], stop: list[str]) -> tuple[list[str], str]:
    """The deltas shown for successive raw texts of a reply (each decoded anew from all its tokens so far)."""
    reply = ReplyDeltas(stop)
    shown = [reply.update(raw) for raw in snapshots] + [reply.finish(snapshots[-1])]
    return [d for d in shown if d], reply.final(snapshots[-1])


def growing(pieces: list[str]) -> list[str]:
    return [("".join(pieces[:i])) for i in range(1, len(pieces) + 1)]


def test_deltas_add_up_to_the_final_text_and_never_show_what_it_will_not_have():
    # a stop string arriving across three pieces is never shown, nor anything after it
    shown, final = deltas_of(growing(["  Hello th", "ere. EN", "D and more"]), ["END"])
    assert "".join(shown) == final == "Hello there."
    assert not any("E" in d for d in shown)
    # trailing whitespace waits for what follows it; a character whose bytes are split over two tokens decodes
    # as U+FFFD until its last byte arrives, and is held back until then
    shown, final = deltas_of(["I hear ", "I hear you \ufffd", "I hear you \u00e9 ", "I hear you \u00e9  "], [])
    assert "".join(shown) == final == "I hear you \u00e9" and shown == ["I hear", " you", " \u00e9"]


def test_deltas_are_prefixes_of_the_final_text_for_any_cut():
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(["a", "b", " ", "\n", "STOP", "<", "|", "e"]) for _ in range(rng.randint(1, 30)))
        cuts = sorted(rng.sample(range(1, len(text) + 1), rng.randint(1, len(text))))
        stop = rng.choice([[], ["STOP"], ["<|", "\n\n"]])
        shown, final = deltas_of([text[:cut] for cut in cuts], stop)
        assert "".join(shown) == final


@pytest.fixture(scope="module")
def local(tiny_models):
    return make_backend(BackendConfig(kind="transformers", model=str(tiny_models.lm), device="cpu"))


async def streamed(backend, messages, params, seed) -> list[str]:
    return [delta async for delta in stream_reply(backend, messages, params, seed)]


def test_the_in_process_stream_is_the_generated_text_whatever_shares_its_batch(local):
    params = PARAMS.model_copy(update={"max_new_tokens": 40, "stop": [". "]})

    async def both():
        others = [asyncio.create_task(local.generate(PROMPTS[i], 2, PARAMS, 70 + i)) for i in range(4)]
        pieces = await asyncio.gather(*(streamed(local, PROMPTS[i], params, 9 + i) for i in range(4)))
        await asyncio.gather(*others)
        return pieces

    pieces = asyncio.run(both())
    for i, deltas in enumerate(pieces):
        alone = asyncio.run(local.generate(PROMPTS[i], 1, params, 9 + i))[0]
        assert "".join(deltas) == alone
    assert max(len(d) for d in pieces) > 3  # token by token, not one block


def test_closing_an_in_process_stream_drops_its_request_from_the_batch(local):
    params = PARAMS.model_copy(update={"max_new_tokens": 200, "stop": []})

    async def close_after_two_deltas():
        with forward_passes(local) as passes:
            stream = stream_reply(local, PROMPTS[0], params, 1)
            for _ in range(2):
                await anext(stream)
            await stream.aclose()
            closed_at = len(passes)
            await asyncio.sleep(0.3)
            return len(passes) - closed_at

    assert asyncio.run(close_after_two_deltas()) <= 1  # at most the pass already under way


@pytest.fixture(scope="module")
def server():
    app = make_app(seconds_per_token=0.002)
    with serve(app) as url:
        yield app, make_backend(BackendConfig(kind="openai", model="sim-chat", base_url=f"{url}/v1"))


def test_a_servers_stream_is_the_text_it_generates(server):
    _, backend = server
    params = SamplingParams(max_new_tokens=30, stop=[" time "])
    for seed in range(5):
        messages = [{"role": "user", "content": f"hello {seed}"}]
        deltas = asyncio.run(streamed(backend, messages, params, seed))
        assert "".join(deltas) == asyncio.run(backend.generate(messages, 1, params, seed))[0]
        assert len(deltas) > 1


def test_closing_a_servers_stream_ends_the_request_at_the_server(server):
    app, backend = server
    answered = app.state.stats.answered

    async def close_early():
        stream = stream_reply(backend, [{"role": "user", "content": "a long one"}], SamplingParams(max_new_tokens=400),
                              0)
        await anext(stream)
        await stream.aclose()
        await asyncio.sleep(0.2)

    asyncio.run(close_early())
    assert app.state.stats.in_flight == 0 and app.state.stats.answered == answered
