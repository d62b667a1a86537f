"""One concurrency limit per backend for the whole process: threads, event loops, batches, cancellation."""

from __future__ import annotations

import asyncio
import fcntl
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mascot.llm.limits import LIMITS_DIR, Limit, request_batch, shared_limit


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


def test_cancelled_waiters_are_skipped_and_the_rest_keep_their_order():
    limit, served = Limit(1), []

    async def request(index: int) -> None:
        async with limit.slot():
            served.append(index)
            await asyncio.sleep(0)

    async def scenario() -> None:
        await limit.acquire()
        tasks = [asyncio.create_task(request(i)) for i in range(10)]
        await asyncio.sleep(0.01)
        assert limit.queued == 10
        for index in (0, 3, 4, 9):  # the head of the queue, two in the middle and the tail
            tasks[index].cancel()
        await asyncio.sleep(0.01)
        assert limit.queued == 6 and limit.held == 1
        limit.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert limit.held == 0 and limit.queued == 0

    asyncio.run(scenario())
    assert served == [1, 2, 5, 6, 7, 8]


def test_cancelling_a_long_queue_takes_linear_time_and_gives_back_its_memory():
    """A failed shard's gather cancels every request still queued: tens of thousands. Each cancel is O(1) (marked,
    skipped when popped), where a search and a re-heapify per cancel made the whole O(n^2): minutes at this size."""
    limit, waiting = Limit(2), 40_000

    async def scenario() -> float:
        for _ in range(limit.size):
            await limit.acquire()
        waiters = [limit.acquire() for _ in range(waiting)]
        for waiter in waiters:
            waiter.send(None)  # runs up to its await: queued
        assert limit.queued == waiting
        began = time.perf_counter()
        for waiter in waiters[:-1]:
            with pytest.raises(asyncio.CancelledError):
                waiter.throw(asyncio.CancelledError())
        seconds = time.perf_counter() - began
        assert limit.queued == 1 and len(limit._waiting) < waiting // 2  # cancelled waiters were swept out
        limit.release()  # the one left gets the slot
        await asyncio.sleep(0)  # the slot's hand-over (call_soon_threadsafe) runs
        with pytest.raises(StopIteration):
            waiters[-1].send(None)
        for _ in range(limit.size):
            limit.release()
        return seconds

    seconds = asyncio.run(scenario())
    assert limit.held == 0 and not limit._waiting
    assert seconds < 5, f"cancelling {waiting:,} queued waiters took {seconds:.1f} s"


def test_shared_limits_are_one_per_key_and_size():
    assert shared_limit(("openai", "http://a", "m"), 4) is shared_limit(("openai", "http://a", "m"), 4)
    assert shared_limit(("openai", "http://a", "m"), 4) is not shared_limit(("openai", "http://b", "m"), 4)
    with pytest.raises(ValueError, match="at least 1"):
        Limit(0)


def hold_slots(folder: str, size: int, requests: int, log: str, seconds: float = 0.05) -> None:
    """In a process of its own: `requests` requests at once, each `seconds` long, through a limit shared by the
    processes of `folder`; each writes its start and end times to `log`."""
    import os

    os.environ[LIMITS_DIR] = folder
    limit = shared_limit(("openai", "http://shared", "m"), size)
    spans = []

    async def request() -> None:
        async with limit.slot():
            began = time.time()
            await asyncio.sleep(seconds)
            spans.append(f"{began} {time.time()}\n")

    async def all_requests() -> None:
        await asyncio.wait_for(asyncio.gather(*(request() for _ in range(requests))), timeout=30)

    asyncio.run(all_requests())
    with open(log, "a") as out:
        out.writelines(spans)


def most_at_once(log) -> int:
    spans = [tuple(map(float, line.split())) for line in log.read_text().splitlines()]
    events = sorted([(began, 1) for began, _ in spans] + [(ended, -1) for _, ended in spans], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def run_in_processes(*calls: tuple) -> None:
    import multiprocessing

    processes = [multiprocessing.get_context("spawn").Process(target=hold_slots, args=args) for args in calls]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0


def test_a_limit_holds_for_the_processes_that_share_its_folder_and_a_dead_one_frees_its_slot(tmp_path):
    import multiprocessing

    folder, log = str(tmp_path / "limits"), tmp_path / "spans.txt"
    run_in_processes(*[(folder, 2, 6, str(log))] * 3)
    assert len(log.read_text().splitlines()) == 18 and most_at_once(log) == 2  # not 2 per process

    # A process killed while it holds both slots takes its locks with it: the next process gets both.
    killed = multiprocessing.get_context("spawn").Process(target=hold_slots, args=(folder, 2, 2, "/dev/null", 60))
    killed.start()
    slots = next((tmp_path / "limits").iterdir())
    deadline = time.monotonic() + 30
    while not all(locked(slots / f"slot-{i}") for i in range(2)):
        assert time.monotonic() < deadline, "the process never held both slots"
        time.sleep(0.05)
    killed.kill()
    killed.join()
    log.unlink()
    run_in_processes((folder, 2, 4, str(log)))
    assert len(log.read_text().splitlines()) == 4 and most_at_once(log) == 2


def locked(path) -> bool:
    with open(path, "a") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False
