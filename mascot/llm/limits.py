"""One concurrency limit per backend for the whole process, shared by every thread and event loop.

A flow run samples and judges many shards at once, each in its own thread with its own event loop.
An `asyncio.Semaphore` per loop would let every shard send `max_concurrency` requests, so a server
would see that number times the shards in flight. A `Limit` hands out the slots of one limit across
all loops instead: the configured number is the number of requests in flight for the whole run.

Slots go first come, first served. Shards are started in order, so the first shard's requests are
answered first and it can be judged while later shards still sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Hashable


class Limit:
    """At most `size` holders at once, across threads and event loops; waiters are served in order."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._held = 0
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()

    @property
    def held(self) -> int:
        return self._held

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._held < self.size and not self._waiting:
                self._held += 1
                return
            waiter = (loop, loop.create_future())
            self._waiting.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            with self._lock:
                queued = waiter in self._waiting
                if queued:
                    self._waiting.remove(waiter)
            if not queued:  # release() had already handed this waiter the slot: pass it on
                self.release()
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiting:
                loop, future = self._waiting.popleft()
                try:  # the slot passes straight to the next waiter, so `_held` stays the same
                    loop.call_soon_threadsafe(_wake, future)
                    return
                except RuntimeError:  # that waiter's loop has closed; it no longer wants the slot
                    continue
            self._held -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


def _wake(future: asyncio.Future) -> None:
    if not future.done():  # a cancelled waiter gives its slot back itself, in acquire()
        future.set_result(None)


_limits: dict[Hashable, Limit] = {}
_limits_lock = threading.Lock()


def shared_limit(key: Hashable, size: int) -> Limit:
    """The process's one `Limit` for `key` (a backend's identity, its size included)."""
    with _limits_lock:
        limit = _limits.get((key, size))
        if limit is None:
            limit = _limits[(key, size)] = Limit(size)
        return limit
