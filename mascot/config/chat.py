"""Talking to a trained group (`mascot chat`): which models answer, the safety guard, and the web page's bounds."""

from __future__ import annotations

from pydantic import Field

from mascot.config.backends import BackendConfig
from mascot.config.base import ConfigPath, Device, ModelRef, Section


class CrisisClassifierConfig(Section):
    """A text-classification model that flags crisis messages beside the rule set (either one suffices)."""

    model: ModelRef = Field(description="A transformers text-classification model: a Hugging Face id or a folder.")
    label: str = Field(default="crisis", min_length=1, description="The label whose score flags a crisis.")
    threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="Flag a message whose score reaches this.")
    device: Device = Field(default="cpu", description="Where the classifier runs.")


class SafetyConfig(Section):
    rules: ConfigPath | None = Field(default=None, description="The rule set and the texts the guard shows (default: "
                                     "the shipped mascot/chat/safety.yaml, documented in docs/chat.md).")
    classifier: CrisisClassifierConfig | None = Field(default=None, description="Optional: a classifier that flags "
                                                      "crisis messages the rules miss.")
    reply_attempts: int = Field(default=3, ge=1, le=10, description="Replies sampled for a turn before one that "
                                "claims to be human or a professional is withheld.")


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
