"""Progress bars for long, concurrent work: one live display per process, one row per shard.

Rows show queries done, requests in flight and request-cache hits. Shards run in several
threads at once, so the display is shared and started when the first row appears.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_lock = threading.Lock()
_display: Progress | None = None
_rows = 0


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("in flight {task.fields[in_flight]}"), TextColumn("cache hits {task.fields[hits]}"),
                    TimeElapsedColumn(), transient=True)


class Row:
    """Counters of one shard's row; the callbacks are safe to call from any thread or task."""

    def __init__(self, display: Progress, task_id, hits: Callable[[], int]):
        self._display, self._task, self._hits, self._in_flight = display, task_id, hits, 0
        self._start_hits = hits()

    def started(self) -> None:
        self._in_flight += 1
        self._refresh()

    def finished(self) -> None:
        self._in_flight -= 1
        self._display.advance(self._task)
        self._refresh()

    def _refresh(self) -> None:
        self._display.update(self._task, in_flight=self._in_flight, hits=self._hits() - self._start_hits)


def cache_hits(cache) -> Callable[[], int]:
    """The hit counter of a request cache (or of none) for a row's 'cache hits' column."""
    return (lambda: cache.hits) if cache is not None else (lambda: 0)


@contextmanager
def shard_progress(description: str, total: int, hits: Callable[[], int]) -> Iterator[Row]:
    """A progress row for the duration of the block."""
    global _display, _rows
    with _lock:
        if _display is None:
            _display = _progress()
            _display.start()
        _rows += 1
        display = _display
        task_id = display.add_task(description, total=total, in_flight=0, hits=0)
    try:
        yield Row(display, task_id, hits)
    finally:
        with _lock:
            display.remove_task(task_id)
            _rows -= 1
            if _rows == 0:
                display.stop()
                _display = None
