"""Backend for OpenAI-compatible chat-completion servers: vLLM, OpenAI, `transformers serve`.

Retries are this package's (`mascot.llm.retries`), not the `openai` client's: on connection errors, timeouts,
408, 409 and 5xx at most `max_retries`, and on a rate limit (429) as many as the request's time budget
(`retry_budget_s`) allows, each wait what the server's Retry-After says (seconds or an HTTP date), else
exponential backoff with jitter; never on other 4xx answers, which retrying cannot fix. A request holds its
slot of the concurrency limit while it waits, so a rate-limited server is not sent more meanwhile.

All `n` candidates are asked for in one request. Servers that return fewer choices
(`transformers serve` ignores `n` and answers with one) are topped up with one request per
missing candidate, issued concurrently; candidate `i` is requested with seed `seed + i`, so the
top-up is as deterministic as the server's seeding.

A choice whose `content` is None (a refusal, or a reply cut off inside a reasoning block that the
server parsed out) becomes the empty string, so callers always get `n` texts; judges then record
such a candidate as unparseable rather than losing it. `empty_replies` counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

import httpx
import openai

from mascot.config import SamplingParams
from mascot.llm.base import (
    BackendError,
    BackendRequestError,
    BackendUnavailable,
    MessageLike,
    check_n,
    normalize_messages,
    truncate_at_stop,
)
from mascot.llm.remote import RemoteBackend
from mascot.llm.retries import RATE_LIMITED, RetryClock
from mascot.llm.streaming import ReplyDeltas

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 409, 429}
T = TypeVar("T")


class OpenAIBackend(RemoteBackend):
    """Async client for one model on an OpenAI-compatible server.

    The client belongs to an event loop, so one is made per loop: the same backend can serve several
    `asyncio.run` calls (one per shard, say). `max_concurrency` holds for the whole process.
    """

    kind = "openai"
    adapter_fingerprint: str | None = None  # the served adapter's SHA-256, for the request cache's key
    default_url = "https://api.openai.com/v1"
    vendor_domain = "openai.com"
    default_key_envs = ("OPENAI_API_KEY",)

    def _open(self) -> tuple[openai.AsyncOpenAI]:
        http_client = openai.DefaultAsyncHttpxClient(event_hooks={"request": [self._count_request]})
        client = openai.AsyncOpenAI(
            api_key=self._api_key(),
            base_url=self.endpoint,  # explicit, so an OPENAI_BASE_URL variable cannot redirect it silently
            timeout=self.timeout_s,
            max_retries=0,  # retried by `_retried`, with a budget in time (mascot.llm.retries)
            http_client=http_client,
        )
        return (client,)

    async def generate(
        self,
        messages: Sequence[MessageLike],
        n: int,
        params: SamplingParams,
        seed: int,
        response_format: dict | None = None,
    ) -> list[str]:
        check_n(n)
        chat = normalize_messages(messages)
        texts = (await self._complete(chat, n, params, seed, response_format))[:n]
        missing = range(len(texts), n)
        if missing:
            log.debug("%s returned %d of %d choices; topping up with %d requests",
                      self.url, len(texts), n, len(missing))
            top_ups = await asyncio.gather(
                *(self._complete(chat, 1, params, seed + index, response_format) for index in missing)
            )
            for index, choices in zip(missing, top_ups):
                if not choices:
                    raise BackendError(f"{self.url} returned no choices for model {self.model!r} "
                                       f"(candidate {index}, seed {seed + index})")
                texts.append(choices[0])
        return texts

    async def _complete(
        self, chat: list[dict], n: int, params: SamplingParams, seed: int, response_format: dict | None
    ) -> list[str]:
        """One chat-completion call; returns the choices' texts in index order (maybe fewer than n)."""
        (client,) = self._loop_state()
        body, clock = self._body(chat, n, params, seed, response_format), RetryClock(self.retry_policy)
        async with self._limit().slot():
            with self._translated_errors(clock):
                completion = await self._retried(clock, lambda: client.chat.completions.create(**body))
        self.calls_made += 1
        texts = []
        for choice in sorted(completion.choices or [], key=lambda c: c.index):
            content = choice.message.content
            if content is None:
                self.empty_replies += 1
                content = ""
            # Servers differ on whether the matched stop string is kept; drop it everywhere.
            texts.append(truncate_at_stop(content, params.stop).strip())
        return texts

    async def stream(self, messages: Sequence[MessageLike], params: SamplingParams, seed: int) -> AsyncIterator[str]:
        """One reply's text as the server streams it (`stream: true`), as deltas of the text `generate` returns
        (`mascot.llm.streaming`). Closing the stream closes the connection, and the server stops decoding."""
        (client,) = self._loop_state()
        raw, deltas = "", ReplyDeltas(params.stop)
        body, clock = self._body(normalize_messages(messages), 1, params, seed, None), RetryClock(self.retry_policy)
        async with self._limit().slot():
            with self._translated_errors(clock):
                chunks = await self._retried(clock, lambda: client.chat.completions.create(**body, stream=True))
                async with chunks:
                    async for chunk in chunks:
                        raw += "".join(choice.delta.content or "" for choice in chunk.choices if choice.index == 0)
                        if delta := deltas.update(raw):
                            yield delta
        self.calls_made += 1
        if delta := deltas.finish(raw):
            yield delta

    def _body(self, chat: list[dict], n: int, params: SamplingParams, seed: int, response_format: dict | None) -> dict:
        request = {
            "model": self.model,
            "messages": chat,
            "n": n,
            "seed": seed,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
        }
        # Only sent when set: some servers treat an empty list differently from no stop at all.
        if params.stop:
            request["stop"] = list(params.stop)
        if response_format is not None:
            request["response_format"] = response_format
        # Fields beyond OpenAI's own, which vLLM and `transformers serve` read from the request body; each only
        # when set. Unset, the server's default applies: the whole vocabulary under `vllm serve --generation-config
        # vllm`, as in TRL and in this process (without it, the model's generation_config.json: Qwen3's top_k 20).
        extra = {"chat_template_kwargs": params.chat_template_kwargs, "top_k": params.top_k, "min_p": params.min_p}
        extra = {name: value for name, value in extra.items() if value not in (None, {})}
        if extra:
            request["extra_body"] = extra
        return request

    @staticmethod
    async def _retried(clock: RetryClock, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, tried again after each failure that may pass, as long as `clock`'s policy allows."""
        while True:
            try:
                return await call()
            except (openai.APIConnectionError, openai.APIStatusError) as exc:  # timeouts are connection errors
                status = getattr(exc, "status_code", None)
                if status is not None and status not in RETRYABLE_STATUS and status < 500:
                    raise  # a refusal that retrying cannot fix
                wait = clock.next_wait(status, exc.response.headers if status is not None else None)
                if wait is None:
                    raise
                await asyncio.sleep(wait)

    @contextlib.contextmanager
    def _translated_errors(self, clock: RetryClock) -> Iterator[None]:
        """The SDK's errors, after the retries `clock` made, as this package's: unavailable (retryable) or refused."""
        try:
            yield
        except openai.APITimeoutError as exc:
            raise BackendUnavailable(self._unavailable_message(clock, f"no answer within {self.timeout_s:g} s")) from exc
        except openai.APIConnectionError as exc:
            raise BackendUnavailable(self._unavailable_message(
                clock, f"connection failed: {exc.__cause__ or exc}")) from exc
        except openai.APIStatusError as exc:
            if exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500:
                raise BackendUnavailable(self._unavailable_message(
                    clock, f"HTTP {exc.status_code}: {_server_detail(exc)}", exc.status_code)) from exc
            raise BackendRequestError(
                f"{self.url} refused the request for model {self.model!r}: "
                f"HTTP {exc.status_code}: {_server_detail(exc)}"
            ) from exc
        except httpx.TransportError as exc:  # a stream cut off after its first bytes: the SDK does not wrap it
            raise BackendUnavailable(self._unavailable_message(clock, f"the stream broke off: {exc}")) from exc

    def _unavailable_message(self, clock: RetryClock, reason: str, status: int | None = None) -> str:
        tried = f"after {clock.retries} retries in {clock.elapsed_s:.1f} s"
        if status == RATE_LIMITED:
            return (f"{self.url} kept rate-limiting model {self.model!r} {tried} ({reason}), the request's retry "
                    f"budget being {self.retry_policy.budget_s:g} s: raise the backend's retry_budget_s, lower its "
                    "max_concurrency, or move to a higher rate-limit tier")
        return (
            f"the OpenAI-compatible server at {self.url} is unavailable {tried} ({reason}). Is it running? Start "
            f"one with `vllm serve {self.model}` or `transformers serve {self.model}`, and check that "
            "generation.base_url points at it."
        )


def _server_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        detail = body.get("message") or body.get("detail") or body.get("error") or body
        return str(detail)[:500]
    return (exc.message or "")[:500]
