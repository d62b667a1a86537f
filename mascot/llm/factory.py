"""Build the backend a `BackendConfig` describes, wrapped in the request cache when one is given."""

from __future__ import annotations

import importlib

from mascot.config import BackendConfig
from mascot.llm.base import BackendError, LLMBackend
from mascot.llm.cache import CachedBackend, RequestCache

VENDOR_KINDS = ("anthropic", "google")
BACKEND_MODULES = {"openai": "mascot.llm.openai_backend", "anthropic": "mascot.llm.anthropic_backend",
                   "google": "mascot.llm.google_backend", "transformers": "mascot.llm.transformers_backend"}
# Without `api_key_env`, each backend reads its vendor's usual variable: OPENAI_API_KEY,
# ANTHROPIC_API_KEY, or GOOGLE_API_KEY then GEMINI_API_KEY.


def make_backend(config: BackendConfig, *, cache: RequestCache | None = None) -> LLMBackend:
    """The backend for `config`, answering from `cache` where it can.

    For `kind: openai`, `anthropic` and `google` the model name is what the server was started with,
    or the vendor's model id. For `kind: transformers`, a `tiny:` reference must be resolved to its
    folder first (`mascot.train.tiny.resolve_tiny_models`).
    """
    if config.kind == "openai":
        from mascot.llm.openai_backend import OpenAIBackend

        backend: LLMBackend = OpenAIBackend(
            config.model,
            base_url=config.base_url,
            api_key_env=config.api_key_env,
            max_concurrency=config.max_concurrency,
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            retry_budget_s=config.retry_budget_s,
        )
        # The served adapter's content, in every request's cache key (mascot.llm.served_adapters).
        backend.adapter_fingerprint = config.adapter_sha256
    elif config.kind in VENDOR_KINDS:
        backend = _vendor_backend(config)
    else:
        from mascot.llm.transformers_backend import TransformersBackend

        if config.model.startswith("tiny:"):
            raise BackendError(
                f"model {config.model!r} is a tiny-model reference; resolve it to its folder first with "
                "mascot.train.tiny.resolve_tiny_models"
            )
        backend = TransformersBackend(config.model, adapter=config.adapter, device=config.device,
                                      max_batch=config.max_batch, max_concurrency=config.max_concurrency)
    return CachedBackend(backend, cache) if cache is not None else backend


def _vendor_backend(config: BackendConfig) -> LLMBackend:
    options = {
        "base_url": config.base_url,
        "api_key_env": config.api_key_env,
        "max_concurrency": config.max_concurrency,
        "timeout_s": config.timeout_s,
        "max_retries": config.max_retries,
        "retry_budget_s": config.retry_budget_s,
    }
    if config.kind == "anthropic":
        from mascot.llm.anthropic_backend import AnthropicBackend

        return AnthropicBackend(config.model, **options)
    from mascot.llm.google_backend import GoogleBackend

    return GoogleBackend(config.model, **options)


def preload(config: BackendConfig) -> None:
    """Import the module (and SDK) that `make_backend(config)` will use: the openai SDK alone takes half a
    second, which a caller can spend while it waits on something else rather than before the first request."""
    importlib.import_module(BACKEND_MODULES[config.kind])
