"""Backend for Anthropic's Messages API, through the official `anthropic` SDK.

How the shared interface maps onto the Messages API:

- System messages become the top-level `system` parameter (joined by blank lines, in order).
  User and assistant messages keep their roles and are sent as they are: the API itself combines
  consecutive same-role turns into one, so nothing is merged here. A message's `name` is dropped
  (the API has no such field).
- The API has no `n`: the `n` candidates are `n` concurrent requests, bounded by the backend's concurrency limit.
- The API has no seed either, so candidates are not reproducible at the vendor. The request
  cache (whose key includes the seed) is what makes a rerun return the same texts.
- `max_new_tokens` becomes `max_tokens`, `stop` becomes `stop_sequences`. The API refuses
  whitespace-only stop sequences, so those are left out of the request; every stop string is
  still applied to the returned text. `chat_template_kwargs` has no meaning for a vendor API and
  is ignored.
- Sampling: SDK 2.x no longer has `temperature` or `top_p` arguments, and the newest models
  answer a request that carries `temperature` with HTTP 400 ("temperature is deprecated for this
  model"). So `temperature` goes in `extra_body`, only when it differs from the API default of
  1.0; when the model refuses it, the request is sent again without it and this backend stops
  sending it. `top_p` is never sent: models since Claude 4.5 refuse it together with
  `temperature`, and the newest refuse it alone.
- `response_format` (OpenAI style) becomes a forced tool call: one tool whose `input_schema` is
  the JSON schema, and `tool_choice` naming it. The tool call's input, as JSON, is the text.
  `json_schema.strict: true` is passed on as the tool's `strict`.

Retries are the SDK's own: exponential backoff from 0.5 s doubling up to 8 s (or the server's
Retry-After), on connection errors, timeouts, 408, 409, 429 and 5xx (529 "overloaded"
included); never on other 4xx answers, which retrying cannot fix.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

try:
    import anthropic
except ImportError as exc:  # the SDK comes with the `api-judges` extra
    raise ImportError(
        "the anthropic backend needs the 'anthropic' package; install it with: pip install 'mascot[api-judges]'"
    ) from exc

from mascot.config import SamplingParams
from mascot.llm.base import (
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
API_DEFAULT_TEMPERATURE = 1.0
JSON_TOOL_NAME = "json_output"  # the forced tool for {"type": "json_object"}


class AnthropicBackend(RemoteBackend):
    """Async client for one Claude model. One client per event loop, as in `OpenAIBackend`."""

    kind = "anthropic"
    default_url = "https://api.anthropic.com"
    vendor_domain = "anthropic.com"
    default_key_envs = ("ANTHROPIC_API_KEY",)

    def __init__(self, model: str, **options):
        super().__init__(model, **options)
        self.sends_temperature = True  # turned off once the model refuses the field

    def _open(self) -> tuple[anthropic.AsyncAnthropic]:
        http_client = anthropic.DefaultAsyncHttpxClient(event_hooks={"request": [self._count_request]})
        client = anthropic.AsyncAnthropic(
            # An explicit key also stops the SDK from looking for profiles and other credentials.
            api_key=self._api_key(),
            base_url=self.endpoint,  # explicit, so an ANTHROPIC_BASE_URL variable cannot redirect it silently
            timeout=self.timeout_s,
            max_retries=self.max_retries,
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
        # `seed` only matters to the request cache: the API cannot take it.
        system, turns = to_anthropic_messages(normalize_messages(messages))
        tool = forced_tool(response_format)
        return list(await asyncio.gather(*(self._create(system, turns, params, tool) for _ in range(n))))

    async def _create(
        self, system: str | None, turns: list[dict], params: SamplingParams, tool: dict | None
    ) -> str:
        """One Messages call; returns its text (or the forced tool call's input as JSON)."""
        request: dict[str, Any] = {"model": self.model, "max_tokens": params.max_new_tokens, "messages": turns}
        if system:
            request["system"] = system
        stops = [s for s in params.stop if s.strip()]
        if stops:
            request["stop_sequences"] = stops
        if tool is not None:
            request["tools"] = [tool]
            request["tool_choice"] = {"type": "tool", "name": tool["name"]}
        (client,) = self._loop_state()
        async with self._limit().slot():
            try:
                message = await client.messages.create(**request, **self._sampling_fields(params))
            except anthropic.BadRequestError as exc:
                if not (self._sampling_fields(params) and "temperature" in _server_detail(exc).lower()):
                    raise self._request_error(exc) from exc
                log.warning("%s refuses 'temperature' for model %r; sending requests without it",
                            self.url, self.model)
                self.sends_temperature = False
                message = await self._send(client, request)
            except anthropic.APIError as exc:
                raise self._translate(exc) from exc
        self.calls_made += 1
        return self._text_of(message, params, tool)

    def _sampling_fields(self, params: SamplingParams) -> dict:
        if self.sends_temperature and params.temperature != API_DEFAULT_TEMPERATURE:
            return {"extra_body": {"temperature": params.temperature}}
        return {}

    async def _send(self, client: anthropic.AsyncAnthropic, request: dict):
        try:
            return await client.messages.create(**request)
        except anthropic.APIError as exc:
            raise self._translate(exc) from exc

    def _text_of(self, message, params: SamplingParams, tool: dict | None) -> str:
        if tool is not None:
            for block in message.content:
                if block.type == "tool_use" and block.name == tool["name"]:
                    return json.dumps(block.input, ensure_ascii=False)
            log.debug("%s answered without the forced tool call (stop_reason %s)", self.url, message.stop_reason)
        # Thinking and other non-text blocks are not part of the reply.
        text = "".join(block.text for block in message.content if block.type == "text")
        text = truncate_at_stop(text, params.stop).strip()
        if not text:
            self.empty_replies += 1
        return text

    def _translate(self, exc: anthropic.APIError) -> Exception:
        if isinstance(exc, anthropic.APITimeoutError):
            return BackendUnavailable(self._unavailable_message(f"no answer within {self.timeout_s:g} s"))
        if isinstance(exc, anthropic.APIConnectionError):
            return BackendUnavailable(self._unavailable_message(f"connection failed: {exc.__cause__ or exc}"))
        if isinstance(exc, anthropic.APIStatusError):
            if exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500:
                return BackendUnavailable(self._unavailable_message(
                    f"HTTP {exc.status_code}: {_server_detail(exc)}"))
            return self._request_error(exc)
        return BackendUnavailable(self._unavailable_message(f"{type(exc).__name__}: {exc}"))

    def _request_error(self, exc: anthropic.APIStatusError) -> BackendRequestError:
        return BackendRequestError(
            f"{self.url} refused the request for model {self.model!r}: "
            f"HTTP {exc.status_code}: {_server_detail(exc)}"
        )

    def _unavailable_message(self, reason: str) -> str:
        return (
            f"the Anthropic API at {self.url} is unavailable after {self.max_retries} retries "
            f"({reason}). Check the network and the base_url; on repeated 429 or 529 answers, "
            "lower max_concurrency."
        )


def to_anthropic_messages(chat: list[dict]) -> tuple[str | None, list[dict]]:
    """Split normalized chat messages into the `system` text and the user/assistant turns."""
    system, turns = [], []
    for index, message in enumerate(chat):
        role, content = message["role"], message["content"]
        if not isinstance(content, str):
            raise TypeError(f"message {index} has {type(content).__name__} content; this backend sends text only")
        if role == "system":
            system.append(content)
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": content})
        else:
            raise ValueError(f"message {index} has role {role!r}; expected system, user or assistant")
    if not turns:
        raise ValueError("the Messages API needs at least one user or assistant message besides the system prompt")
    return "\n\n".join(system) or None, turns


def forced_tool(response_format: dict | None) -> dict | None:
    """The tool whose forced call carries the JSON answer, or None for plain text."""
    if response_format is None or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"name": JSON_TOOL_NAME, "description": "Give the answer as a JSON object.",
                "input_schema": {"type": "object"}}
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        name = spec.get("name") or JSON_TOOL_NAME
        tool = {
            "name": name,
            "description": spec.get("description") or f"Give the answer as JSON matching the '{name}' schema.",
            "input_schema": spec.get("schema") or {"type": "object"},
        }
        if spec.get("strict"):
            tool["strict"] = True
        return tool
    raise ValueError(f"response_format type {kind!r} is not supported; expected json_schema, json_object or text")


def _server_detail(exc: anthropic.APIStatusError) -> str:
    # Anthropic errors look like {"type": "error", "error": {"type": ..., "message": ...}}.
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        detail = error.get("message") if isinstance(error, dict) else None
        return str(detail or error or body)[:500]
    return (exc.message or "")[:500]
