"""LLM backends in a config: where a model runs, how it samples, and the judges built on them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import Field, model_validator

from mascot.config.base import TINY_MODELS, ConfigPath, Device, EnvVarName, HttpUrl, ModelRef, Section
from mascot.yamlio import FieldError


class SamplingParams(Section):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="Sampling temperature.")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int | None = Field(default=None, ge=1, description="Sample among the k likeliest tokens only (unset: all; "
                              "sent to servers as vLLM's `top_k`).")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, description="Drop tokens less likely than min_p times "
                                "the likeliest (unset: none; sent to servers as vLLM's `min_p`).")
    max_new_tokens: int = Field(default=256, ge=1, le=32768, description="Longest reply, in tokens.")
    stop: list[str] = Field(default_factory=list, description="Extra stop strings.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Chat-template variables, e.g. `{enable_thinking: false}` for Qwen3."
    )


class BackendConfig(Section):
    kind: Literal["transformers", "openai", "anthropic", "google"] = Field(
        description="In-process transformers, an OpenAI-compatible server, or the Anthropic or Google API."
    )
    model: ModelRef = Field(description="Model id or path; for servers, the served model name.")
    adapter: ConfigPath | None = Field(default=None, description="PEFT adapter folder (transformers backend).")
    base_url: HttpUrl | None = Field(
        default=None, description="Server URL without credentials; for openai it ends in /v1 (default: the vendor's API)."
    )
    api_key_env: EnvVarName | None = Field(
        default=None, description="Name of the environment variable holding the API key, never the key (default: "
        "OPENAI_API_KEY, ANTHROPIC_API_KEY, or GOOGLE_API_KEY then GEMINI_API_KEY, by kind)."
    )
    max_concurrency: int = Field(default=16, ge=1, description="Requests in flight at once, for the whole flow run "
                                 "(every shard and thread of it).")
    max_batch: int = Field(default=32, ge=1, description="transformers backend: the most sequences decoded together "
                           "in one forward pass (a request asks for n); 1 decodes one sequence at a time.")
    timeout_s: float = Field(default=120.0, gt=0, description="Per-request timeout in seconds.")
    max_retries: int = Field(default=4, ge=0, description="Retries per request of a failure that may pass (a refused "
                             "connection, a timeout, 5xx), with exponential backoff or the server's Retry-After.")
    retry_budget_s: float = Field(default=600.0, gt=0, description="openai: the most seconds a request may spend "
                                  "retrying from its first try; a rate limit (429) is retried however many times "
                                  "within it, waiting what Retry-After says.")
    device: Device = Field(default="auto", description="transformers backend: 'auto', 'cpu', 'cuda', 'cuda:1'...")
    params: SamplingParams = Field(default_factory=SamplingParams, description="Default sampling parameters.")
    load_adapter: bool = Field(
        default=False, description="openai, for a trained role (stage2.speaker, eval.speaker, eval.director, chat's): "
        "the flow loads the run's adapter into the server (vLLM's /v1/load_lora_adapter) as <role>-<its hash> "
        "before the first request, and `model` is the server's base model. Without it, `model` names a LoRA module "
        "the server already serves (--lora-modules). On stage2.director (the base Director, `model` the base): the "
        "Director's GRPO policy snapshots and its before/after comparison are sampled on this server, each snapshot "
        "loaded as director-<its hash> and unloaded when training moves past it, instead of in the trainer's process.")
    adapter_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="Set by the flow, not in a config: the content hash of "
        "the adapter a served name stands for, part of every request's cache key.")

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> BackendConfig:
        if self.kind != "openai" and self.load_adapter:
            raise FieldError("load_adapter", f"'load_adapter' loads an adapter into an OpenAI-compatible server (vLLM); "
                                             f"kind: {self.kind} cannot load one")
        if self.kind != "transformers" and "max_batch" in self.model_fields_set:
            raise FieldError("max_batch", f"'max_batch' is for kind: transformers; a {self.kind} server batches by itself")
        vendor = self.is_vendor_api or self.kind in ("anthropic", "google")
        if self.is_vendor_api and (pinned := moving_alias_problem(self.kind, self.model)):
            raise FieldError("model", pinned)
        for field in ("top_k", "min_p"):
            if vendor and getattr(self.params, field) is not None:
                raise FieldError(f"params.{field}", f"'{field}' is sent to OpenAI-compatible servers (vLLM, "
                                 f"`transformers serve`) and used in this process; the {self.kind} vendor API does "
                                 "not take it: leave it unset")
        if self.kind == "transformers":
            if self.base_url is not None:
                raise FieldError("base_url", "'base_url' is for servers; kind: transformers runs the model in this process")
            return self
        if self.model in TINY_MODELS:
            raise FieldError("model", f"{self.model} is built and run in this process, so it needs kind: transformers, "
                                      f"not kind: {self.kind}")
        if self.adapter is not None:
            raise FieldError("adapter", "'adapter' is only used with kind: transformers; serve adapters with vLLM "
                                        "--lora-modules, or let the flow load a trained role's (load_adapter: true)")
        return self


    @property
    def is_vendor_api(self) -> bool:
        """Whether requests go to the vendor's own API (OpenAI, Anthropic, Google), not a server of the run's."""
        if self.kind == "transformers":
            return False
        if self.base_url is None:
            return True
        host = (urlparse(str(self.base_url)).hostname or "").lower()
        return any(host == domain or host.endswith("." + domain) for domain in VENDOR_DOMAINS[self.kind])


# The vendors' APIs; a base_url elsewhere is a server of the run's own (vLLM, a proxy, a loopback test).
VENDOR_DOMAINS = {"openai": ("openai.com",), "anthropic": ("anthropic.com",), "google": ("googleapis.com",)}
# A vendor's model name that stays one model: OpenAI's dated snapshots (gpt-4o-2024-08-06), Anthropic's
# (claude-sonnet-4-5-20250929), Google's numbered versions (gemini-2.0-flash-001).
PINNED = {"openai": re.compile(r"-\d{4}-\d{2}-\d{2}$"), "anthropic": re.compile(r"-\d{8}$"),
          "google": re.compile(r"-\d{3}$")}
PINNED_EXAMPLE = {"openai": "gpt-4o-2024-08-06", "anthropic": "claude-sonnet-4-5-20250929",
                  "google": "gemini-2.0-flash-001"}


def moving_alias_problem(kind: str, model: str) -> str | None:
    """Why a vendor API's `model` will not do, or None: an alias (gpt-4o) moves to new weights when the vendor
    says, while the request cache keys on the name, so a record of one model would answer for another."""
    if PINNED[kind].search(model):
        return None
    return (f"'{model}' is a moving alias: the {kind} API moves it to newer weights, and the request cache keys "
            f"on the name, so earlier records would answer for another model. Name a pinned snapshot, for example "
            f"'{PINNED_EXAMPLE[kind]}'")


class JudgeConfig(Section):
    kind: Literal["heuristic", "llm", "planted"] = Field(
        description="The offline heuristic judge, an LLM judge, or a planted group judge whose best policy is known "
                    "by construction (for known-optimum checks, stage2.judges only; see docs/stage2.md).")
    name: str | None = Field(default=None, description="Label in artifacts (default: the backend model or the kind).")
    backend: BackendConfig | None = Field(default=None, description="LLM judges: the model that judges.")
    max_attempts: int = Field(default=3, ge=1, description="LLM judges: tries per candidate before recording a failure.")
    prefer: dict[str, str] | None = Field(
        default=None, description="Planted judges: for each value of a context's `cue` metadata, the persona id that "
                                  "should speak first after the user's message.")
    control: Literal["flipped", "shuffled"] | None = Field(
        default=None, description="Planted judges: score the opposite (`flipped`), or by a seeded coin with the same "
                                  "base rate, whatever the trajectory (`shuffled`).")

    @model_validator(mode="after")
    def _backend_for_llm_judges(self) -> JudgeConfig:
        if self.kind == "llm" and self.backend is None:
            raise FieldError("backend", "an 'llm' judge needs 'backend' (kind, model and, for servers, base_url)")
        if self.kind != "llm" and self.backend is not None:
            raise FieldError("backend", f"the {self.kind} judge takes no 'backend'")
        if self.kind == "planted" and not self.prefer:
            raise FieldError("prefer", "a 'planted' judge needs 'prefer': the persona id to speak first, per cue")
        for field in ("prefer", "control"):
            if self.kind != "planted" and getattr(self, field) is not None:
                raise FieldError(field, f"'{field}' is only used with kind: planted")
        return self

    @property
    def label(self) -> str:
        return self.name or (self.backend.model if self.backend else self.kind)

    @property
    def model_identity(self) -> str:
        """Which model judges, whatever the judge is called: the heuristic, or the model's own name (lowercased,
        without a hub organisation or folder, so `google/gemma-3-27b-it` and `gemma-3-27b-it` are one model)
        and its adapter. The backend kind and base URL are left out on purpose: the same weights behind another
        server or client are the same judge, and a judge renamed or moved must not pass as an independent one."""
        if self.backend is None:
            return self.kind
        model = self.backend.model.rstrip("/").rsplit("/", 1)[-1].lower()
        adapter = self.backend.adapter
        return model if adapter is None else f"{model}+{Path(adapter).resolve().name}"
