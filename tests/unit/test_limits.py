"""One concurrency limit per backend for the whole process: threads, event loops, batches, cancellation."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mascot.llm.limits import Limit, request_batch, shared_limit


class Holders:
    """Counts the holders of a limit at once, from any thread."""

    def __init__(self):
        self._lock, self.now, self.most = threading.Lock(), 0, 0

    def enter(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


def test_the_limit_holds_across_threads_and_event_loops():
    limit, holders = Limit(3), Holders()

    async def request() -> None:
        async with limit.slot():
            holders.enter()
            await asyncio.sleep(0.01)
            holders.leave()

    def shard() -> None:  # as a sampling task does: its own thread, its own event loop
        async def all_requests():
            await asyncio.gather(*(request() for _ in range(10)))

        asyncio.run(all_requests())

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda _: shard(), range(6)))
    assert holders.most == 3 and limit.held == 0


def test_the_batch_that_began_first_is_served_first():
    limit, served = Limit(1), []

    async def request(batch: str, index: int) -> None:
        async with limit.slot():
            served.append(batch)
            await asyncio.sleep(0.001)

    def shard(batch: str, began: threading.Event, go: threading.Event) -> None:
        with request_batch():
            began.set()
            go.wait()  # both batches have begun; the later one now queues its requests first

            async def all_requests():
                await asyncio.gather(*(request(batch, i) for i in range(5)))

            asyncio.run(all_requests())

    async def hold() -> None:
        await limit.acquire()

    asyncio.run(hold())  # the slot is taken, so every request below has to queue
    first_began, second_began, go_first, go_second = (threading.Event() for _ in range(4))
    first = threading.Thread(target=shard, args=("first", first_began, go_first))
    second = threading.Thread(target=shard, args=("second", second_began, go_second))
    first.start()
    first_began.wait()
    time.sleep(0.01)
    second.start()
    second_began.wait()
    go_second.set()
    time.sleep(0.05)  # the second batch's requests are queued before the first batch's
    go_first.set()
    time.sleep(0.05)
    limit.release()
    first.join()
    second.join()
    assert served == ["first"] * 5 + ["second"] * 5


def test_a_cancelled_waiter_gives_its_slot_back():
    limit = Limit(1)

    async def scenario() -> None:
        await limit.acquire()
        waiter = asyncio.create_task(limit.acquire())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        limit.release()
        async with limit.slot():  # free again: the cancelled waiter took nothing with it
            assert limit.held == 1
        assert limit.held == 0

    asyncio.run(scenario())


def test_shared_limits_are_one_per_key_and_size():
    assert shared_limit(("openai", "http://a", "m"), 4) is shared_limit(("openai", "http://a", "m"), 4)
    assert shared_limit(("openai", "http://a", "m"), 4) is not shared_limit(("openai", "http://b", "m"), 4)
    with pytest.raises(ValueError, match="at least 1"):
        Limit(0)
