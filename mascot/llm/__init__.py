"""LLM backends behind one async interface, and the on-disk request cache under all of them.

    backend = make_backend(config.generation, cache=RequestCache(cache_root / "requests.sqlite"))
    texts = await backend.generate(messages, n=8, params=config.generation.params, seed=0)

The backend modules import lazily, so importing this package needs neither torch, nor the vendor
SDKs, nor a server.
"""

from mascot.llm.base import (
    BackendError,
    BackendRequestError,
    BackendUnavailable,
    LLMBackend,
    MessageLike,
    MissingAPIKey,
    normalize_messages,
)
from mascot.llm.cache import (
    CachedBackend,
    CacheStats,
    RequestCache,
    describe_request,
    request_key,
    shared_cache,
)
from mascot.llm.factory import make_backend
from mascot.llm.limits import request_batch, run_requests
from mascot.torch_runtime import MissingTrainExtra

__all__ = [
    "BackendError",
    "BackendRequestError",
    "BackendUnavailable",
    "CacheStats",
    "CachedBackend",
    "LLMBackend",
    "MessageLike",
    "MissingAPIKey",
    "MissingTrainExtra",
    "RequestCache",
    "describe_request",
    "make_backend",
    "normalize_messages",
    "request_batch",
    "request_key",
    "run_requests",
    "shared_cache",
]


def __getattr__(name: str):
    # The backend classes, without importing their SDKs or transformers until they are asked for.
    if name == "AnthropicBackend":
        from mascot.llm.anthropic_backend import AnthropicBackend

        return AnthropicBackend
    if name == "GoogleBackend":
        from mascot.llm.google_backend import GoogleBackend

        return GoogleBackend
    if name == "OpenAIBackend":
        from mascot.llm.openai_backend import OpenAIBackend

        return OpenAIBackend
    if name == "TransformersBackend":
        from mascot.llm.transformers_backend import TransformersBackend

        return TransformersBackend
    raise AttributeError(f"module 'mascot.llm' has no attribute {name!r}")
