"""One concurrency limit per backend for the whole process, shared by every thread and event loop.

A flow run samples and judges many shards at once, each in its own thread with its own event loop.
An `asyncio.Semaphore` per loop would let every shard send `max_concurrency` requests, so a server
would see that number times the shards in flight. A `Limit` hands out the slots of one limit across
all loops instead: the configured number is the number of requests in flight for the whole run.

Slots go first come, first served, by batch: the requests made inside one `request_batch()` block
(one shard's) queue behind those of every batch that began earlier, however the threads of
several shards interleave. So the first shard to start is answered first, and it can be judged
while later shards still sample, instead of every shard finishing at the very end.

A waiter that is cancelled is only marked, and skipped when it reaches the head of the queue; cancelled waiters
are swept out in one pass once they are most of the queue. So a failed shard of a million queued requests leaves
in seconds, where a search and a re-heapify per cancel took about a day (`benchmarks/limits.py`).

A shard's event loop runs under `run_requests`, not `asyncio.run`: when one of its requests fails, its queued
requests are cancelled, but those already sent are let finish, so an answer the server has sent (and been paid
for) reaches the request cache instead of being dropped and paid for again by the resume.

A flow run can also spread over processes (the workers of a Dask or Ray task runner, or the
processes of a training step under `accelerate launch`). Then a folder in MASCOT_LIMITS_DIR is named
to all of them, and a limit is also a set of `size` slot files there: a request holds an exclusive
lock on one of them while in flight (`fcntl.flock`), so the processes together never have more than
`size` requests in flight. A process that dies lets go of its locks with it, so a crash never leaks
a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import heapq
import itertools
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Coroutine, Hashable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

LIMITS_DIR = "MASCOT_LIMITS_DIR"  # set for the processes of one flow run (or of one training launch)

# When the batch of the running code began; requests outside any batch are a batch of their own.
_batch_began: ContextVar[float | None] = ContextVar("batch_began", default=None)


@contextlib.contextmanager
def request_batch() -> Iterator[None]:
    """Requests made in this block (and in the event loops it runs) queue as one batch, in order of its start."""
    token = _batch_began.set(time.monotonic())
    try:
        yield
    finally:
        _batch_began.reset(token)


class _Waiter:
    """A queued request: ordered by its batch's start, then by arrival. A cancelled one stays in the heap, marked,
    and is skipped when it comes to the top, so cancelling costs O(1) rather than a search and a re-heapify."""

    __slots__ = ("began", "cancelled", "future", "loop", "order", "popped")

    def __init__(self, began: float, order: int, loop: asyncio.AbstractEventLoop):
        self.began, self.order, self.loop = began, order, loop
        self.future = loop.create_future()
        self.cancelled = self.popped = False

    def __lt__(self, other: _Waiter) -> bool:
        return (self.began, self.order) < (other.began, other.order)


# Every limit of the process, and the event loops whose shard has failed: those take no slot any more.
_every_limit: weakref.WeakSet[Limit] = weakref.WeakSet()
_stopped_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _refuse_if_stopped(loop: asyncio.AbstractEventLoop) -> None:
    if loop in _stopped_loops:
        raise asyncio.CancelledError("its shard has failed: the request is not sent")


class Limit:
    """At most `size` holders at once, across threads and event loops; waiters are served by batch, then in order."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a concurrency limit must be at least 1, got {size}")
        self.size = size
        _every_limit.add(self)
        self._lock = threading.Lock()
        self._held = 0
        self._order = itertools.count()
        self._waiting: list[_Waiter] = []  # a heap, cancelled waiters included until they are popped or swept
        self._cancelled = 0  # how many of `_waiting` are cancelled

    @property
    def held(self) -> int:
        return self._held

    @property
    def queued(self) -> int:
        """Waiters still wanting a slot (cancelled ones not counted)."""
        return len(self._waiting) - self._cancelled

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        _refuse_if_stopped(loop)
        began = _batch_began.get()
        with self._lock:
            if self._held < self.size and not self.queued:
                self._held += 1
                return
            waiter = _Waiter(time.monotonic() if began is None else began, next(self._order), loop)
            heapq.heappush(self._waiting, waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                queued = not waiter.popped
                if queued:
                    self._cancel(waiter)
            if not queued:  # release() had already handed this waiter the slot: pass it on
                self.release()
            raise

    def _cancel(self, waiter: _Waiter) -> None:
        """Mark a queued waiter cancelled (the lock held). When cancelled waiters are most of the heap, sweep them
        out in one pass, so a queue whose requests are all cancelled (a failed shard's) gives back its memory
        at O(1) amortised per waiter."""
        waiter.cancelled = True
        self._cancelled += 1
        if self._cancelled > 1024 and self._cancelled * 2 > len(self._waiting):
            self._waiting = [w for w in self._waiting if not w.cancelled]
            heapq.heapify(self._waiting)
            self._cancelled = 0

    def refuse(self, loop: asyncio.AbstractEventLoop) -> None:
        """Cancel the waiters of `loop` (called in it), in one pass: each leaves through `acquire`'s cancel path."""
        with self._lock:
            waiting = [w for w in self._waiting if w.loop is loop and not w.cancelled]
        for waiter in waiting:
            waiter.future.cancel()

    def release(self) -> None:
        with self._lock:
            while self._waiting:
                waiter = heapq.heappop(self._waiting)
                if waiter.cancelled:
                    self._cancelled -= 1
                    continue
                waiter.popped = True
                try:  # the slot passes straight to the next waiter, so `_held` stays the same
                    waiter.loop.call_soon_threadsafe(_wake, waiter.future)
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


class ProcessesLimit(Limit):
    """A `Limit` that also holds across the processes that share `folder`: at most `size` slot files locked."""

    def __init__(self, size: int, folder: Path):
        super().__init__(size)
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with super().slot():  # this process's share first, in its order
            handle = await self._lock_a_slot_file()
            try:
                yield
            finally:
                os.close(handle)  # closing the file releases its lock

    async def _lock_a_slot_file(self) -> int:
        wait, loop = 0.002, asyncio.get_running_loop()
        while True:
            _refuse_if_stopped(loop)
            for index in range(self.size):
                handle = os.open(self.folder / f"slot-{index}", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return handle
                except BlockingIOError:
                    os.close(handle)
            await asyncio.sleep(wait)  # every slot is held by another process: look again soon
            wait = min(wait * 2, 0.05)


def run_requests(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` for a shard's requests, except when `main` fails: the requests already sent finish.

    `asyncio.run` would cancel every task left when one request's error ends `main`, and a request cancelled on
    the wire drops an answer the server may have sent already, which a resume then pays for again. Here the
    loop's queued requests are cancelled (they are never sent), its sent ones run to their end and reach the
    request cache, and then `main`'s error is raised. An interrupt (Ctrl-C) still cancels everything at once.
    """

    async def settled() -> T:
        try:
            return await main
        except Exception:
            loop = asyncio.get_running_loop()
            _stopped_loops.add(loop)
            for limit in list(_every_limit):
                limit.refuse(loop)
            await asyncio.gather(*asyncio.all_tasks() - {asyncio.current_task()}, return_exceptions=True)
            raise

    return asyncio.run(settled())


def _wake(future: asyncio.Future) -> None:
    if not future.done():  # a cancelled waiter gives its slot back itself, in acquire()
        future.set_result(None)


_limits: dict[Hashable, Limit] = {}
_limits_lock = threading.Lock()


def shared_limit(key: Hashable, size: int) -> Limit:
    """The process's one `Limit` for `key` (a backend's identity, its size included); across the flow run's
    processes when it has several (MASCOT_LIMITS_DIR)."""
    folder = os.environ.get(LIMITS_DIR)
    with _limits_lock:
        limit = _limits.get((key, size, folder))
        if limit is None:
            name = hashlib.sha256(repr((key, size)).encode()).hexdigest()[:16]
            limit = Limit(size) if not folder else ProcessesLimit(size, Path(folder) / name)
            _limits[(key, size, folder)] = limit
        return limit
