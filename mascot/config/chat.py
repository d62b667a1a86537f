"""Talking to a trained group (`mascot chat`): which models answer, the safety guard, and the web page's bounds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mascot.config.backends import BackendConfig
from mascot.config.base import ConfigPath, Device, EnvVarName, HttpUrl, ModelRef, Section
from mascot.yamlio import FieldError


class CrisisClassifierConfig(Section):
    """A text-classification model that flags crisis messages beside the rule set (either one suffices)."""

    model: ModelRef = Field(description="A transformers text-classification model: a Hugging Face id or a folder.")
    label: str = Field(default="crisis", min_length=1, description="The label whose score flags a crisis.")
    threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="Flag a message whose score reaches this.")
    device: Device = Field(default="cpu", description="Where the classifier runs.")


# The categories that flag a message, by kind: Llama Guard 3's S11 (Suicide & Self-Harm), and the self-harm
# categories of OpenAI's moderation endpoint.
FLAGGING_CATEGORIES = {"llama_guard": ["S11"],
                       "openai_moderation": ["self-harm", "self-harm/intent", "self-harm/instructions"]}


class ModerationConfig(Section):
    """A moderation model asked about every message beside the rule set; either one flags it (docs/chat.md)."""

    kind: Literal["llama_guard", "openai_moderation"] = Field(description="A Llama Guard 3 model served by vLLM "
                                                             "(OpenAI-compatible), or OpenAI's moderation endpoint.")
    model: str = Field(min_length=1, description="The served model name (llama_guard) or a pinned moderation model "
                       "(openai_moderation, e.g. omni-moderation-2024-09-26).")
    base_url: HttpUrl | None = Field(default=None, description="The server, ending in /v1 (needed for llama_guard; "
                                     "default for openai_moderation: OpenAI's API).")
    api_key_env: EnvVarName | None = Field(default=None, description="The variable holding the API key (default: "
                                           "OPENAI_API_KEY; a local server needs none).")
    timeout_s: float = Field(default=10.0, gt=0, description="A check that takes longer fails, and flags the message.")
    max_retries: int = Field(default=1, ge=0, le=5, description="Retries of a failed check before it flags the message.")
    categories: list[str] | None = Field(default=None, description="The categories that flag a message (default: S11 "
                                         "for llama_guard; self-harm, self-harm/intent and self-harm/instructions for "
                                         "openai_moderation).")

    @model_validator(mode="after")
    def _served_guard_has_a_server(self) -> ModerationConfig:
        if self.kind == "llama_guard" and self.base_url is None:
            raise FieldError("base_url", "a llama_guard model is served by vLLM: give its base_url, e.g. "
                             "http://127.0.0.1:8003/v1")
        return self

    def flagging_categories(self) -> list[str]:
        return self.categories if self.categories is not None else FLAGGING_CATEGORIES[self.kind]


class SafetyConfig(Section):
    rules: ConfigPath | None = Field(default=None, description="The rule set and the texts the guard shows (default: "
                                     "the shipped mascot/chat/safety.yaml, documented in docs/chat.md).")
    classifier: CrisisClassifierConfig | None = Field(default=None, description="Optional: a classifier that flags "
                                                      "crisis messages the rules miss.")
    moderation: ModerationConfig | None = Field(default=None, description="Optional: a moderation model asked about "
                                                "every message beside the rules (llama_guard or openai_moderation).")
    reply_attempts: int = Field(default=3, ge=1, le=10, description="Replies sampled for a turn before one that "
                                "breaks a reply rule is withheld.")


class ChatConfig(Section):
    """`mascot chat RUN_DIR`: the run's trained group in a terminal or a local web page."""

    turns: int = Field(default=2, ge=1, le=8, description="Companion turns after each message of the person.")
    speaker: BackendConfig | None = Field(default=None, description="The trained Speaker; by default the "
                                          "evaluation's (eval.speaker, stage2.speaker, or Stage 1's adapter in "
                                          "this process).")
    director: BackendConfig | None = Field(default=None, description="The trained Director; by default eval.director, "
                                           "or stage2/director in this process.")
    max_message_chars: int = Field(default=2000, ge=1, description="The longest message a person may send.")
    max_messages: int = Field(default=100, ge=1, description="Messages of the person per conversation; then "
                              "/reset starts a new one.")
    max_sessions: int = Field(default=8, ge=1, description="Web page: conversations held at once (browser tabs).")
    session_idle_s: float = Field(default=1800.0, gt=0, description="Web page: a conversation idle this long is "
                                  "dropped, and its place freed.")
    safety: SafetyConfig = Field(default_factory=SafetyConfig, description="The safety guard of both surfaces.")
