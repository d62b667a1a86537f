"""Backend for Google's Gemini API, through the official `google-genai` SDK.

How the shared interface maps onto `generateContent`:

- System messages become `system_instruction` (joined by blank lines, in order). User messages
  keep the role `user`; assistant messages take the role `model`. Consecutive messages of one
  role are merged into one turn with one part per message: that is what a turn with several
  messages means, and it is valid for every Gemini model, including those that insist on
  alternating roles. A message's `name` is dropped (the API has no such field).
- `n`: all candidates are asked for in one request (`candidate_count`, at most 8, the API's
  limit) with `seed`. When fewer come back, or `n` is above 8, each missing candidate `i` is one
  more request with `seed + i`, issued concurrently, as `OpenAIBackend` tops up. A model that
  refuses `candidate_count` above 1 (HTTP 400 naming it) gets one request per candidate from
  then on. Seeds are reduced modulo 2**31, because the API takes a 32-bit signed seed.
- `max_new_tokens` becomes `max_output_tokens`, `stop` becomes `stop_sequences`; `temperature`
  and `top_p` are sent as they are. `chat_template_kwargs` has no meaning for a vendor API and is
  ignored.
- `response_format` (OpenAI style) becomes `response_mime_type="application/json"` plus, for
  `json_schema`, `response_json_schema` (raw JSON Schema; `response_schema` would need the
  OpenAPI subset).
- A candidate blocked by safety filters (no content) and a prompt blocked outright (no
  candidates) become empty texts, so callers always get `n` texts; `empty_replies` counts them.

`base_url` is the API root without a version (default https://generativelanguage.googleapis.com);
the SDK adds its API version (`v1` in google-genai 3.x) and `/models/<model>:generateContent`.

Retries are the SDK's own (`HttpRetryOptions`, tenacity inside the SDK): exponential backoff with
jitter from `retry_delay_s` doubling, on connection errors, timeouts, 408, 429, 500, 502, 503 and
504; never on other 4xx answers. The HTTP client is an httpx2 client made here, so that the SDK
uses it rather than aiohttp when that is installed, and so that every attempt is counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

try:
    import httpx2  # google-genai's own HTTP client library
    from google import genai
    from google.genai import errors, types
except ImportError as exc:  # the SDK comes with the `api-judges` extra
    raise ImportError(
        "the google backend needs the 'google-genai' package; install it with: pip install 'mascot[api-judges]'"
    ) from exc

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

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 409, 429}
MAX_CANDIDATES = 8  # the Gemini API's upper bound on candidate_count
SEED_MODULUS = 2**31


class GoogleBackend(RemoteBackend):
    """Async client for one Gemini model. One client per event loop, as in `OpenAIBackend`."""

    kind = "google"
    default_url = "https://generativelanguage.googleapis.com"
    vendor_domain = "googleapis.com"
    # The same variables, in the same order, as the SDK reads when it is given no key.
    default_key_envs = ("GOOGLE_API_KEY", "GEMINI_API_KEY")

    def __init__(self, model: str, *, retry_delay_s: float = 1.0, **options):
        super().__init__(model, **options)
        self.retry_delay_s = retry_delay_s  # first backoff; it doubles per retry (plus jitter)
        self.multi_candidate = True  # turned off once the model refuses candidate_count > 1

    def _open(self) -> tuple[genai.Client, httpx2.AsyncClient]:
        http_client = httpx2.AsyncClient(event_hooks={"request": [self._count_request]})
        options = types.HttpOptions(
            base_url=self.endpoint,
            timeout=round(self.timeout_s * 1000),  # milliseconds
            retry_options=types.HttpRetryOptions(
                attempts=self.max_retries + 1,  # the SDK counts the first try as an attempt
                initial_delay=self.retry_delay_s,
                jitter=self.retry_delay_s,
            ),
            httpx_async_client=http_client,
        )
        # vertexai=False: a GOOGLE_GENAI_USE_VERTEXAI variable must not switch APIs silently.
        client = genai.Client(api_key=self._api_key(), vertexai=False, http_options=options)
        return client, http_client

    async def _close(self, state) -> None:
        await state[1].aclose()  # our HTTP client, so the SDK leaves closing it to us

    async def generate(
        self,
        messages: Sequence[MessageLike],
        n: int,
        params: SamplingParams,
        seed: int,
        response_format: dict | None = None,
    ) -> list[str]:
        check_n(n)
        system, contents = to_gemini_contents(normalize_messages(messages))
        config = generation_config(system, params, response_format)
        first = min(n, MAX_CANDIDATES) if self.multi_candidate else 1
        try:
            texts = (await self._generate(contents, config, first, seed))[:n]
        except BackendRequestError as exc:
            if first == 1 or "candidate" not in str(exc).lower():
                raise
            log.info("%s refuses candidate_count > 1 for model %r; asking one candidate per request",
                     self.url, self.model)
            self.multi_candidate = False
            texts = []
        missing = range(len(texts), n)
        if missing:
            log.debug("%s returned %d of %d candidates; topping up with %d requests",
                      self.url, len(texts), n, len(missing))
            top_ups = await asyncio.gather(*(self._generate(contents, config, 1, seed + i) for i in missing))
            for index, candidates in zip(missing, top_ups):
                if not candidates:
                    raise BackendError(f"{self.url} returned no candidates for model {self.model!r} "
                                       f"(candidate {index}, seed {seed + index})")
                texts.append(candidates[0])
        return texts

    async def _generate(
        self, contents: list[types.Content], config: types.GenerateContentConfig, count: int, seed: int
    ) -> list[str]:
        """One generateContent call; returns its candidates' texts (maybe fewer than `count`)."""
        update = {"seed": seed % SEED_MODULUS}
        if count > 1:  # left out otherwise, for models that know nothing of candidate_count
            update["candidate_count"] = count
        client, _ = self._loop_state()
        async with self._limit().slot():
            try:
                response = await client.aio.models.generate_content(
                    model=self.model, contents=contents, config=config.model_copy(update=update)
                )
            except errors.APIError as exc:
                status = exc.code or 0
                detail = str(exc.message or exc.details)[:500]
                if status in RETRYABLE_STATUS or status >= 500:
                    raise BackendUnavailable(self._unavailable_message(f"HTTP {status}: {detail}")) from exc
                raise BackendRequestError(
                    f"{self.url} refused the request for model {self.model!r}: HTTP {status}: {detail}"
                ) from exc
            except httpx2.TimeoutException as exc:
                raise BackendUnavailable(self._unavailable_message(
                    f"no answer within {self.timeout_s:g} s")) from exc
            except httpx2.TransportError as exc:
                raise BackendUnavailable(self._unavailable_message(f"connection failed: {exc}")) from exc
        self.calls_made += 1
        candidates = response.candidates or []
        if not candidates and response.prompt_feedback and response.prompt_feedback.block_reason:
            # Asking again would be blocked again: give empty texts, which judges record as failures.
            log.warning("%s blocked the prompt for model %r: %s", self.url, self.model,
                        response.prompt_feedback.block_reason)
            self.empty_replies += count
            return [""] * count
        texts = []
        for candidate in candidates:
            parts = (candidate.content.parts if candidate.content else None) or []
            # Thought summaries are not part of the reply.
            text = "".join(part.text for part in parts if part.text and not part.thought)
            text = truncate_at_stop(text, config.stop_sequences or []).strip()
            if not text:
                self.empty_replies += 1
            texts.append(text)
        return texts

    def _unavailable_message(self, reason: str) -> str:
        return (
            f"the Gemini API at {self.url} is unavailable after {self.max_retries} retries ({reason}). "
            "Check the network and the base_url; on repeated 429 answers, lower max_concurrency."
        )


def to_gemini_contents(chat: list[dict]) -> tuple[str | None, list[types.Content]]:
    """Split normalized chat messages into the system instruction and user/model turns."""
    system: list[str] = []
    contents: list[types.Content] = []
    for index, message in enumerate(chat):
        role, content = message["role"], message["content"]
        if not isinstance(content, str):
            raise TypeError(f"message {index} has {type(content).__name__} content; this backend sends text only")
        if role == "system":
            system.append(content)
            continue
        if role not in ("user", "assistant"):
            raise ValueError(f"message {index} has role {role!r}; expected system, user or assistant")
        gemini_role = "user" if role == "user" else "model"
        if contents and contents[-1].role == gemini_role:
            contents[-1].parts.append(types.Part(text=content))
        else:
            contents.append(types.Content(role=gemini_role, parts=[types.Part(text=content)]))
    if not contents:
        raise ValueError("generateContent needs at least one user or assistant message besides the system prompt")
    return "\n\n".join(system) or None, contents


def generation_config(
    system: str | None, params: SamplingParams, response_format: dict | None
) -> types.GenerateContentConfig:
    """Everything in a request's config except the per-request seed and candidate count."""
    config = types.GenerateContentConfig(
        system_instruction=system,
        temperature=params.temperature,
        top_p=params.top_p,
        max_output_tokens=params.max_new_tokens,
        stop_sequences=list(params.stop) or None,  # None leaves the field out of the request
    )
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object":
        config.response_mime_type = "application/json"
    elif kind == "json_schema":
        config.response_mime_type = "application/json"
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema is not None:
            config.response_json_schema = schema
    elif kind != "text":
        raise ValueError(f"response_format type {kind!r} is not supported; expected json_schema, json_object or text")
    return config
