"""A million requests queued in the concurrency limiter, one of which fails: how long until they have all left it.

    python benchmarks/limits.py [--requests 1000000 --size 16 --baseline-requests 20000 --end-to-end]

When one request of a judging shard exhausts its retries, `asyncio.gather` raises and `run_requests` cancels every
request of the shard still queued (`Limit.refuse`), so each leaves the limiter's queue by its cancel path. Three
figures:

1. **The limiter alone**: `--requests` waiters queue behind a full `mascot.llm.limits.Limit` (the real `acquire`
   coroutine, stepped by hand without an asyncio Task), then every one is cancelled. This is the figure of the
   acceptance (a million, in seconds).
2. **Beside the old cancel path**: the same at `--baseline-requests` for the limiter and for a copy of it as it was
   before cancelling became lazy (the waiter searched for in the heap, removed, the heap rebuilt: O(n) a cancel,
   O(n^2) a queue), kept in this file; and that time scaled by n^2 to `--requests`, since timing it there would take
   hours.
3. With `--end-to-end`: `--requests` asyncio tasks in one `gather` under `run_requests`, each holding a slot while
   it "answers" (a zero sleep), the first to get a slot failing; beside it, the same tasks queued on one future with no limiter, the
   event loop's own floor. Most of both is asyncio's and the garbage collector's cost of a million live tasks,
   which is why the evaluation's scoring runs in shards too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import resource
import time

from mascot.llm.limits import Limit, _batch_began, run_requests


class OldCancelLimit(Limit):
    """The limiter's queue before lazy cancellation: tuples in the heap; a cancelled one removed by a search."""

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        began = _batch_began.get()
        with self._lock:
            if self._held < self.size and not self._waiting:
                self._held += 1
                return
            waiter = (time.monotonic() if began is None else began, next(self._order), loop, loop.create_future())
            heapq.heappush(self._waiting, waiter)
        try:
            await waiter[3]
        except asyncio.CancelledError:
            with self._lock:
                queued = waiter in self._waiting
                if queued:
                    self._waiting.remove(waiter)
                    heapq.heapify(self._waiting)
            if not queued:
                self.release()
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiting:
                *_, loop, future = heapq.heappop(self._waiting)
                try:
                    loop.call_soon_threadsafe(_wake, future)
                    return
                except RuntimeError:
                    continue
            self._held -= 1


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class RequestFailed(Exception):
    pass


def queue_and_cancel(limit: Limit, requests: int) -> tuple[float, float, float]:
    """The limiter alone: `requests` waiters queued behind a full limit, then every one cancelled, as a failed
    shard's are. Each waiter is the real `Limit.acquire` coroutine, stepped by hand (no Task), so
    the figure is the limiter's and not the event loop's. Seconds to queue them all, seconds to cancel them all, and
    the CPU seconds of both (on a shared machine, wall time also counts the other processes' turns)."""

    async def scenario() -> tuple[float, float, float]:
        for _ in range(limit.size):
            await limit.acquire()
        cpu = time.process_time()
        began = time.perf_counter()
        waiters = [limit.acquire() for _ in range(requests)]
        for waiter in waiters:
            waiter.send(None)  # runs up to `await future`: queued
        queued = time.perf_counter()
        for waiter in waiters:
            try:
                waiter.throw(asyncio.CancelledError())
            except asyncio.CancelledError:
                pass
        cancelled = time.perf_counter()
        for _ in range(limit.size):
            limit.release()
        return queued - began, cancelled - queued, time.process_time() - cpu

    gc.collect()
    seconds = asyncio.run(scenario())
    if limit.held != 0 or limit._waiting:
        raise SystemExit(f"after the cancels: {limit.held} slots held, {len(limit._waiting)} waiters left")
    return seconds


def gather_with_a_failure(limit: Limit | None, requests: int) -> float:
    """End to end, as a judging shard runs: `requests` tasks in one `asyncio.gather`, each holding a slot of `limit`
    while it answers (a zero sleep); the first to get a slot fails, `gather` raises, and `run_requests` cancels every
    request still queued. Seconds from the first request's creation to the failure raised. With `limit` None, the
    same tasks queue on one future instead, and `asyncio.run` cancels them: the event loop's own cost, the floor
    under any limiter."""
    blocked: asyncio.Future | None = None

    async def request(index: int) -> None:
        if limit is None:
            if index:
                await blocked
            await asyncio.sleep(0)
            if index == 0:
                raise RequestFailed
            return
        async with limit.slot():
            await asyncio.sleep(0)
            if index == 0:
                raise RequestFailed("request 0 exhausted its retries")

    async def all_requests() -> None:
        nonlocal blocked
        blocked = asyncio.get_running_loop().create_future()
        await asyncio.gather(*(request(i) for i in range(requests)))

    gc.collect()
    began = time.perf_counter()
    try:
        (asyncio.run if limit is None else run_requests)(all_requests())
    except RequestFailed:
        pass
    else:
        raise SystemExit("the failing request did not fail")
    if limit is not None and limit.held != 0:
        raise SystemExit(f"{limit.held} slots still held after every request stopped")
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=16, help="the limit (requests in flight)")
    parser.add_argument("--baseline-requests", type=int, default=20_000,
                        help="queue size at which the old cancel path is timed beside the new one (0: skip)")
    parser.add_argument("--end-to-end", action="store_true",
                        help="also time the tasks end to end in one gather, with the event loop's floor beside")
    args = parser.parse_args()

    queue, cancel, cpu = queue_and_cancel(Limit(args.size), args.requests)
    print(f"limiter, lazy cancel: {args.requests:,} waiters queued in {queue:.2f} s, all cancelled in {cancel:.2f} s "
          f"(wall {queue + cancel:.2f} s, CPU {cpu:.2f} s)")
    if args.baseline_requests:
        n = args.baseline_requests
        _, new_cancel, _ = queue_and_cancel(Limit(args.size), n)
        _, old_cancel, _ = queue_and_cancel(OldCancelLimit(args.size), n)
        print(f"limiter at {n:,} waiters: cancelling all takes {new_cancel:.3f} s lazily, {old_cancel:.2f} s by "
              f"the old search + re-heapify ({old_cancel / new_cancel:,.0f}x); the old path is O(n^2), so at "
              f"{args.requests:,} about {old_cancel * (args.requests / n) ** 2 / 60:,.0f} min")
    if args.end_to_end:
        limited = gather_with_a_failure(Limit(args.size), args.requests)
        floor = gather_with_a_failure(None, args.requests)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"end to end: {args.requests:,} tasks in one gather, one fails: {limited:.2f} s through the limiter, "
              f"{floor:.2f} s for the same tasks with no limiter (the event loop's floor); peak RSS {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
