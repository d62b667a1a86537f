"""What every HTTP backend shares: the API key, per-event-loop clients, one concurrency limit, pickling.

The key is read from the environment whenever a client is made and never kept on the object, so
it cannot reach a repr, a pickle, a log or the request cache. A client belongs to one event loop,
so one is made per loop: the same backend serves several `asyncio.run` calls (one per shard) and
can be sent to worker processes. The concurrency limit is not per loop but per process
(`mascot.llm.limits`): every backend object for the same server and model shares it.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any
from urllib.parse import urlparse

from mascot.llm.base import MissingAPIKey
from mascot.llm.limits import Limit, shared_limit
from mascot.llm.retries import RetryPolicy
from mascot.redaction import redact, redact_url

# Servers other than the vendor's (vLLM, proxies, loopback tests) accept any key; clients insist on one.
PLACEHOLDER_KEY = "EMPTY"


class RemoteBackend:
    """Base of the OpenAI-compatible, Anthropic and Google backends."""

    kind: str
    default_url: str  # the vendor's API
    vendor_domain: str  # a base_url on this domain needs a real key
    default_key_envs: tuple[str, ...]  # read in order when api_key_env is not set

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str | None = None,
        max_concurrency: int = 16,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        retry_budget_s: float = 600.0,
    ):
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_budget_s = retry_budget_s
        self.requests_sent = 0  # HTTP requests, retries included: what the server sees
        self.calls_made = 0  # successful API calls
        self.empty_replies = 0  # replies without text
        self._api_key()  # fail now, not at the first request, when the key is missing
        self._per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(max_retries=self.max_retries, budget_s=self.retry_budget_s)

    @property
    def endpoint(self) -> str:
        """Where requests go; only the SDK client sees it."""
        return self.base_url or self.default_url

    @property
    def url(self) -> str:
        """The endpoint as messages and logs show it: without credentials, should a URL carry any."""
        return redact_url(self.endpoint)

    def __repr__(self) -> str:
        # Deliberately no key, and no client (whose repr could show headers).
        return f"{type(self).__name__}(model={self.model!r}, url={self.url!r})"

    def is_vendor_url(self) -> bool:
        host = urlparse(self.endpoint).hostname or ""
        return host == self.vendor_domain or host.endswith("." + self.vendor_domain)

    def _api_key(self) -> str:
        names = (self.api_key_env,) if self.api_key_env else self.default_key_envs
        for name in names:
            if os.environ.get(name):
                return os.environ[name]
        if self.is_vendor_url():
            shown = " or ".join(redact(name, "api_key_env") for name in names)  # a pasted key is not echoed
            raise MissingAPIKey(
                f"the environment variable {shown} is not set; it must hold the API key for "
                f"{self.url} (or set api_key_env to the variable that holds it, or base_url to a local server)"
            )
        return PLACEHOLDER_KEY

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_per_loop": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _per_loop=weakref.WeakKeyDictionary())

    async def _count_request(self, _request) -> None:
        # An httpx event hook: it fires for every attempt, so retries are counted too.
        self.requests_sent += 1

    def _open(self) -> tuple[Any, ...]:
        """A new client for the running loop; subclasses build their SDK's client."""
        raise NotImplementedError

    def _limit(self) -> Limit:
        """This server and model's `max_concurrency`, for every shard and thread of the process."""
        return shared_limit((self.kind, self.endpoint, self.model), self.max_concurrency)

    async def _close(self, state: tuple[Any, ...]) -> None:
        await state[0].close()

    def _loop_state(self) -> tuple[Any, ...]:
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            state = self._per_loop[loop] = self._open()
        return state

    async def aclose(self) -> None:
        """Close this event loop's HTTP client (optional; clients of finished loops are dropped)."""
        state = self._per_loop.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await self._close(state)
