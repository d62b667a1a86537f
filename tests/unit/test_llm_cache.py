"""The on-disk request cache: stable keys, hit/miss accounting, persistence, several writers."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3

import pytest

from mascot.config import SamplingParams
from mascot.data.context import Message
from mascot.llm import CachedBackend, RequestCache, describe_request, request_key
from mascot.llm.base import truncate_at_stop

MESSAGES = [{"role": "system", "content": "You are The Anchor."}, {"role": "user", "content": "I failed my exam."}]


def key_for(**changes) -> str:
    request = {"kind": "openai", "model": "Qwen/Qwen3-8B", "adapter": None, "messages": MESSAGES,
               "params": SamplingParams(), "n": 8, "seed": 0, "response_format": None}
    request.update(changes)
    return request_key(describe_request(**request))


class CountingBackend:
    """A stand-in backend that answers instantly and counts calls: the cache is what is tested."""

    kind = "openai"
    model = "counting-model"

    def __init__(self):
        self.calls = 0

    async def generate(self, messages, n, params, seed, response_format=None):
        self.calls += 1
        return [f"seed {seed} candidate {i} t={params.temperature}" for i in range(n)]


def test_key_is_stable_and_ignores_message_form_and_dict_order():
    key = key_for()
    assert key == key_for()
    assert len(key) == 64 and int(key, 16) >= 0
    as_models = [Message(role="system", content="You are The Anchor."), Message(role="user", content="I failed my exam.")]
    reordered = [{"content": m["content"], "role": m["role"]} for m in MESSAGES]
    assert key_for(messages=as_models) == key == key_for(messages=reordered)
    # A golden value: if this changes, every cached record of earlier runs stops matching. Bump
    # KEY_VERSION on purpose instead of changing the key by accident.
    assert key == "c8ede63370fc1105048856bfb0846322ecbe4db67381bef9806a3b9b62e292d0"


@pytest.mark.parametrize("changes", [
    {"seed": 1},
    {"n": 4},
    {"params": SamplingParams(temperature=0.7)},
    {"params": SamplingParams(stop=["\n\n"])},
    {"params": SamplingParams(top_k=20)},
    {"params": SamplingParams(min_p=0.05)},
    {"model": "Qwen/Qwen3-0.6B"},
    {"kind": "transformers"},
    {"adapter": "/adapters/speaker"},
    {"response_format": {"type": "json_object"}},
    {"messages": MESSAGES[1:]},
])
def test_anything_that_changes_the_samples_changes_the_key(changes):
    assert key_for(**changes) != key_for()


def test_hits_and_misses_are_counted_and_hits_skip_the_backend(tmp_path):
    cache = RequestCache(tmp_path / "requests.sqlite")
    backend = CountingBackend()
    cached = CachedBackend(backend, cache)
    params = SamplingParams()

    async def run():
        first = await cached.generate(MESSAGES, 3, params, seed=0)
        again = await cached.generate(MESSAGES, 3, params, seed=0)
        other_seed = await cached.generate(MESSAGES, 3, params, seed=1)
        other_params = await cached.generate(MESSAGES, 3, SamplingParams(temperature=0.5), seed=0)
        return first, again, other_seed, other_params

    first, again, other_seed, other_params = asyncio.run(run())
    assert first == again and len(first) == 3
    assert other_seed != first and other_params != first
    assert backend.calls == 3
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.lookups) == (1, 3, 4)
    assert stats.hit_rate == pytest.approx(0.25)
    assert stats.as_dict() == {"hits": 1, "misses": 3, "lookups": 4, "hit_rate": 0.25}
    assert len(cache) == 3
    assert cached.kind == "openai" and cached.model == "counting-model"


def test_records_persist_across_instances(tmp_path):
    path = tmp_path / "nested" / "requests.sqlite"
    first = CachedBackend(CountingBackend(), RequestCache(path))
    texts = asyncio.run(first.generate(MESSAGES, 2, SamplingParams(), seed=7))
    first.cache.close()

    backend = CountingBackend()
    second = CachedBackend(backend, RequestCache(path))
    assert asyncio.run(second.generate(MESSAGES, 2, SamplingParams(), seed=7)) == texts
    assert backend.calls == 0 and second.cache.stats().hits == 1
    # The stored record describes the request, for audits of what was paid for.
    with sqlite3.connect(path) as connection:
        (record,) = connection.execute("SELECT request FROM requests").fetchone()
    assert '"seed":7' in record and "The Anchor" in record


def test_first_stored_answer_wins(tmp_path):
    cache = RequestCache(tmp_path / "requests.sqlite")
    cache.put("k", ["first"])
    cache.put("k", ["second"])
    assert cache.get("k") == ["first"]


def test_empty_cache_reports_zero_hit_rate(tmp_path):
    assert RequestCache(tmp_path / "requests.sqlite").stats().hit_rate == 0.0


def _write_many(path: str, worker: int, count: int) -> None:
    cache = RequestCache(path)
    for i in range(count):
        # Half the keys are shared between the workers, so both write the same rows at once.
        key = f"shared-{i}" if i % 2 else f"worker{worker}-{i}"
        cache.put(key, [f"worker {worker}", str(i)], {"i": i})
        assert cache.get(key) is not None


def test_two_processes_write_concurrently(tmp_path):
    path = str(tmp_path / "requests.sqlite")
    RequestCache(path).close()  # create the file and schema first, as a run's first task would
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_write_many, args=(path, worker, 200)) for worker in (0, 1)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(timeout=60)
    assert [process.exitcode for process in workers] == [0, 0]
    cache = RequestCache(path)
    assert len(cache) == 100 + 100 + 100  # 100 own keys per worker, 100 shared ones
    assert cache.get("shared-1")[1] == "1" and cache.get("worker1-0") == ["worker 1", "0"]


def test_truncate_at_stop_cuts_at_the_earliest_stop_string():
    assert truncate_at_stop("Hello. Bye.\nUser: hi", ["\nUser:", "Bye"]) == "Hello. "
    assert truncate_at_stop("no stop here", ["###"]) == "no stop here"
    assert truncate_at_stop("keep", []) == "keep"


class SlowBackend(CountingBackend):
    """Answers after a pause, so that identical requests overlap; fails when told to."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.fail = fail

    async def generate(self, messages, n, params, seed, response_format=None):
        self.calls += 1
        await asyncio.sleep(0.05)
        if self.fail:
            raise ConnectionError("server down")
        return [f"seed {seed} candidate {i}" for i in range(n)]


def test_identical_requests_at_the_same_moment_make_one_call_in_any_thread(tmp_path):
    import threading

    backend = SlowBackend()
    cached = CachedBackend(backend, RequestCache(tmp_path / "requests.sqlite"))
    params = SamplingParams()

    async def together():
        return await asyncio.gather(*(cached.generate(MESSAGES, 2, params, seed=7) for _ in range(3)))

    answers = []
    threads = [threading.Thread(target=lambda: answers.extend(asyncio.run(together()))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert backend.calls == 1 and len(answers) == 6 and all(a == answers[0] for a in answers)


def test_requests_waiting_on_a_failed_one_see_its_error_and_a_later_one_calls_again(tmp_path):
    backend = SlowBackend(fail=True)
    cached = CachedBackend(backend, RequestCache(tmp_path / "requests.sqlite"))

    async def together():
        return await asyncio.gather(*(cached.generate(MESSAGES, 1, SamplingParams(), seed=3) for _ in range(2)),
                                    return_exceptions=True)

    assert [type(error) for error in asyncio.run(together())] == [ConnectionError, ConnectionError]
    assert backend.calls == 1
    backend.fail = False
    assert asyncio.run(cached.generate(MESSAGES, 1, SamplingParams(), seed=3)) == ["seed 3 candidate 0"]
    assert backend.calls == 2
