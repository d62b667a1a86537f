"""The GRPO Speaker's rewards: the persona reward model, format, and conciseness, with their weights.

Each is a callable in TRL's reward-function form, `fn(prompts, completions, **kwargs) -> list[float]`,
where prompts and completions are chat messages. TRL logs each under its `__name__`
(`rewards/persona_rm/mean`, ...). The same callables score the before/after comparison, so the
numbers reported after training are computed exactly as the rewards were during training.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mascot.config import SpeakerConfig
from mascot.roster import Roster
from mascot.train.reward_model import RewardModelScorer
from mascot.train.runtime import trainer_device

Messages = list[dict[str, str]]

GENERIC_LABELS = ("assistant", "user", "system", "speaker", "companion", "listener", "seeker", "supporter")
REASONING = re.compile(r"</?think>|<\|im_(?:start|end)\|>", re.IGNORECASE)
META_TALK = re.compile(
    r"\b(?:as an ai|an ai (?:language )?model|a language model|as a persona|my persona|i am an? (?:ai|bot|chatbot)"
    r"|i'm an? (?:ai|bot|chatbot)|as your (?:ai|assistant)|system prompt)\b",
    re.IGNORECASE,
)
CLEAN_ENDING = re.compile(r"[.!?…)\"'”’*]\s*$")


def _text(completion: Messages | str) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


class FormatReward:
    """Share of the format rules a reply passes: 1.0 for a clean reply, 0.0 when it breaks them all.

    The rules: no role label or speaker tag at the start of a line ("Anchor:", "[The Beacon]",
    "Assistant:"), no leftover reasoning block or chat-control token, no meta-talk about being
    an AI or a persona, and an ending on finished punctuation rather than mid-sentence.
    """

    __name__ = "format"

    def __init__(self, persona_names: list[str]):
        names = {label.lower() for label in GENERIC_LABELS}
        for name in persona_names:
            names |= {name.lower(), re.sub(r"^the\s+", "", name.lower())}
        alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
        self.role_label = re.compile(rf"^[\s*]*(?:\[\s*(?:{alternatives})\s*\]|(?:{alternatives})[\s*]*:)",
                                     re.IGNORECASE | re.MULTILINE)

    def checks(self, text: str) -> dict[str, bool]:
        """Each rule, True when the reply passes it."""
        return {
            "no_role_label": self.role_label.search(text) is None,
            "no_reasoning_block": REASONING.search(text) is None,
            "no_meta_talk": META_TALK.search(text) is None,
            "clean_ending": CLEAN_ENDING.search(text) is not None,
        }

    def score(self, text: str) -> float:
        checks = self.checks(text)
        return sum(checks.values()) / len(checks)

    def __call__(self, prompts: list[Messages], completions: list[Messages | str], **_: Any) -> list[float]:
        return [self.score(_text(c)) for c in completions]


class ConcisenessReward:
    """1.0 inside a band of word counts, falling linearly to 0 at no words and at twice the upper bound."""

    __name__ = "conciseness"

    def __init__(self, min_words: int, max_words: int):
        self.min_words, self.max_words = min_words, max_words

    def score(self, text: str) -> float:
        words = len(text.split())
        if words < self.min_words:
            return words / self.min_words
        if words > self.max_words:
            return max(0.0, 1.0 - (words - self.max_words) / self.max_words)
        return 1.0

    def __call__(self, prompts: list[Messages], completions: list[Messages | str], **_: Any) -> list[float]:
        return [self.score(_text(c)) for c in completions]


def speaker_rewards(config: SpeakerConfig, roster: Roster, persona_rm: Path) -> list:
    """The reward functions, in the order of `speaker_reward_weights`."""
    return [
        RewardModelScorer(persona_rm, name="persona_rm", device=trainer_device(config),
                          chat_template_kwargs=config.chat_template_kwargs),
        FormatReward([p.name for p in roster.personas]),
        ConcisenessReward(config.min_words, config.max_words),
    ]


def speaker_reward_weights(config: SpeakerConfig) -> list[float]:
    weights = config.reward_weights
    return [weights.persona_rm, weights.format, weights.conciseness]
