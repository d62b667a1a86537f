"""The one interface every LLM backend implements, its errors, and small shared helpers.

A backend turns chat messages into `n` completion texts. Two implementations exist: an
OpenAI-compatible HTTP client (vLLM, OpenAI, `transformers serve`) and an in-process transformers
model. `CachedBackend` (in `mascot.llm.cache`) wraps either with the on-disk request cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from mascot.config import SamplingParams

# A message is a plain `{"role": ..., "content": ...}` dict or a pydantic `Message`.
MessageLike = Mapping[str, Any] | BaseModel


class BackendError(RuntimeError):
    """An LLM backend could not produce the requested completions."""


class BackendUnavailable(BackendError):
    """The server could not be reached (or kept failing) after all retries."""


class BackendRequestError(BackendError):
    """The server refused the request (a 4xx answer other than 408/409/429): retrying cannot help."""


class MissingAPIKey(BackendError):
    """The environment variable that should hold the API key is not set."""


@runtime_checkable
class LLMBackend(Protocol):
    """Anything that can sample chat completions.

    `generate` returns exactly `n` texts. The same (messages, params, seed) asks the backend for
    the same samples; whether it honours the seed is up to the backend (vLLM and the in-process
    backend do). `response_format` is an OpenAI-style `{"type": "json_schema", ...}` or
    `{"type": "json_object"}`; backends that cannot constrain output ignore it.
    """

    kind: str
    model: str

    async def generate(
        self,
        messages: Sequence[MessageLike],
        n: int,
        params: SamplingParams,
        seed: int,
        response_format: dict | None = None,
    ) -> list[str]: ...


def normalize_messages(messages: Sequence[MessageLike]) -> list[dict[str, Any]]:
    """Plain dicts without None fields, so pydantic messages and dicts hash and send the same."""
    normalized = []
    for index, message in enumerate(messages):
        if isinstance(message, BaseModel):
            normalized.append(message.model_dump(exclude_none=True))
        elif isinstance(message, Mapping):
            normalized.append({key: value for key, value in message.items() if value is not None})
        else:
            raise TypeError(f"message {index} is a {type(message).__name__}; expected a dict or a Message")
        if "role" not in normalized[-1] or "content" not in normalized[-1]:
            raise ValueError(f"message {index} needs 'role' and 'content', got keys {sorted(normalized[-1])}")
    if not normalized:
        raise ValueError("messages is empty; a chat completion needs at least one message")
    return normalized


def check_n(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """Cut `text` at the earliest stop string (the stop string itself is dropped, as servers do)."""
    cut = min((position for s in stop if s and (position := text.find(s)) >= 0), default=len(text))
    return text[:cut]
