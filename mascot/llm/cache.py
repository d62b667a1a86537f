"""On-disk request cache shared by all backends, so no paid-for completion is requested twice.

One SQLite file in WAL mode: several processes (Prefect workers, shards) can read and write it at
once, and every write is one atomic transaction, so a killed run leaves whole records only.
The key is the sha256 of canonical JSON of everything that decides the sampled texts: backend
kind, model, adapter, messages, sampling parameters, n, seed and response format. The server URL
is left out on purpose: the same model served on another port samples the same texts. API keys
are never part of a request description, so they can never reach the file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mascot.config import SamplingParams
from mascot.llm.base import LLMBackend, MessageLike, check_n, normalize_messages

# Bump when the meaning of a stored record changes, so old records stop matching.
KEY_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    key TEXT PRIMARY KEY,
    request TEXT NOT NULL,
    texts TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""


def describe_request(
    *,
    kind: str,
    model: str,
    adapter: str | None,
    messages: Sequence[MessageLike],
    params: SamplingParams,
    n: int,
    seed: int,
    response_format: dict | None,
    sampler: str | None = None,
) -> dict[str, Any]:
    """Everything that decides the sampled texts, as plain JSON-ready data.

    `sampler` names an in-process backend's decoding algorithm; servers leave it out, so their records'
    keys stay as they were."""
    return {
        "version": KEY_VERSION,
        **({"sampler": sampler} if sampler else {}),
        "kind": kind,
        "model": model,
        "adapter": adapter,
        "messages": normalize_messages(messages),
        # An unset sampling parameter (None) is left out, so adding one keeps the keys of earlier records.
        "params": params.model_dump(mode="json", exclude_none=True),
        "n": n,
        "seed": seed,
        "response_format": response_format,
    }


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_key(request: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(request).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        """Share of lookups answered from disk; 0.0 before the first lookup."""
        return self.hits / self.lookups if self.lookups else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "lookups": self.lookups, "hit_rate": self.hit_rate}


class RequestCache:
    """SQLite-backed map from request key to the list of completion texts.

    Hits and misses are counted per instance (this process), for reports.
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 30.0):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._connection_pid: int | None = None
        self._connect()  # fail early, with the path in the error, if the file cannot be opened

    def __repr__(self) -> str:
        return f"RequestCache({str(self.path)!r}, hits={self.hits}, misses={self.misses})"

    def _connect(self) -> sqlite3.Connection:
        # A connection must not cross a fork, so a child process opens its own.
        if self._connection is None or self._connection_pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                connection = sqlite3.connect(
                    self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
                )
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                connection.execute(_SCHEMA)
            except sqlite3.Error as exc:
                raise OSError(f"cannot open the request cache {self.path}: {exc}") from exc
            self._connection, self._connection_pid = connection, os.getpid()
        return self._connection

    def get(self, key: str) -> list[str] | None:
        """The stored texts for `key`, counting a hit or a miss."""
        with self._lock:
            row = self._connect().execute("SELECT texts FROM requests WHERE key = ?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
            return json.loads(row[0])

    def put(self, key: str, texts: Sequence[str], request: dict[str, Any] | None = None) -> None:
        """Store texts for `key`. The first stored answer wins, so replays stay stable."""
        record = canonical_json(request or {})
        with self._lock:
            self._connect().execute(
                "INSERT OR IGNORE INTO requests (key, request, texts, created_at) VALUES (?, ?, ?, ?)",
                (key, record, json.dumps(list(texts), ensure_ascii=False), time.time()),
            )

    def __len__(self) -> int:
        with self._lock:
            return self._connect().execute("SELECT COUNT(*) FROM requests").fetchone()[0]

    def stats(self) -> CacheStats:
        return CacheStats(hits=self.hits, misses=self.misses)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None and self._connection_pid == os.getpid():
                self._connection.close()
            self._connection = None

    def __getstate__(self) -> dict[str, Any]:
        # Picklable (e.g. for worker processes): the connection is reopened on first use.
        state = self.__dict__.copy()
        state.update(_lock=None, _connection=None, _connection_pid=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


_shared: dict[Path, RequestCache] = {}
_shared_lock = threading.Lock()


def shared_cache(path: str | Path) -> RequestCache:
    """One request cache per file and process, so its hit and miss counts cover a whole run."""
    path = Path(path)
    with _shared_lock:  # shards start in several threads at once
        if path not in _shared:
            _shared[path] = RequestCache(path)
        return _shared[path]


# Requests being answered now, by key: an identical request that arrives meanwhile (two GRPO samples
# of the same directive roll out the same turns, say) waits for that answer instead of paying for it
# again. concurrent.futures, not asyncio: the waiter may run in another thread's event loop.
_in_flight: dict[str, concurrent.futures.Future] = {}
_in_flight_lock = threading.Lock()


class CachedBackend:
    """Wrap any backend: answer from the request cache when possible, otherwise call and store.

    Identical requests at the same moment, in any thread of the process, make one call: the later
    ones wait for the first one's answer (or its error).
    """

    def __init__(self, backend: LLMBackend, cache: RequestCache):
        self.backend = backend
        self.cache = cache
        self.kind = backend.kind
        self.model = backend.model

    def __repr__(self) -> str:
        return f"CachedBackend({self.backend!r}, {self.cache!r})"

    def describe(self, messages, n: int, params: SamplingParams, seed: int, response_format=None) -> dict:
        return describe_request(
            kind=self.backend.kind,
            model=self.backend.model,
            # A content fingerprint where the backend has one: a retrained adapter saved to the
            # same folder must not be answered from the old adapter's records.
            adapter=getattr(self.backend, "adapter_fingerprint", None) or getattr(self.backend, "adapter", None),
            messages=messages,
            params=params,
            n=n,
            seed=seed,
            response_format=response_format,
            sampler=getattr(self.backend, "sampler", None),
        )

    async def generate(
        self,
        messages: Sequence[MessageLike],
        n: int,
        params: SamplingParams,
        seed: int,
        response_format: dict | None = None,
    ) -> list[str]:
        check_n(n)
        request = self.describe(messages, n, params, seed, response_format)
        key = request_key(request)
        stored = self.cache.get(key)
        if stored is not None:
            return stored
        with _in_flight_lock:
            pending = _in_flight.get(key)
            if pending is None:
                _in_flight[key] = mine = concurrent.futures.Future()
        if pending is not None:
            return list(await asyncio.wrap_future(pending))
        try:
            texts = await self.backend.generate(messages, n, params, seed, response_format=response_format)
            self.cache.put(key, texts, request)
            mine.set_result(texts)
            return texts
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        finally:
            with _in_flight_lock:
                del _in_flight[key]
