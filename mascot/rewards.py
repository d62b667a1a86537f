"""Reward functions for the GRPO Speaker: the persona reward model, format, and conciseness.

Each is a callable in TRL's reward-function form, `fn(prompts, completions, **kwargs) -> list[float]`,
where prompts and completions are chat messages. TRL logs each under its `__name__`
(`rewards/persona_rm/mean`, ...). The same callables score the before/after comparison, so the
numbers reported after training are computed exactly as the rewards were during training.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mascot.llm.transformers_backend import quiet_transformers

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


class PersonaRewardModel:
    """The trained persona reward model as a reward function: it scores prompt + reply as one chat.

    The chat is rendered with the tokenizer's chat template, as TRL's RewardTrainer rendered the
    training pairs, so a reply is scored in exactly the form the model learned from. Loaded once.
    """

    __name__ = "persona_rm"

    def __init__(self, path: str | Path, device: str = "cpu", batch_size: int = 16,
                 chat_template_kwargs: dict[str, Any] | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        with quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).to(device).eval()
        self.device, self.batch_size = device, batch_size
        self.chat_template_kwargs = chat_template_kwargs or {}
        self._torch = torch

    def score(self, prompts: list[Messages], replies: list[str]) -> list[float]:
        ids = [
            self.tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": reply}], tokenize=True,
                                               return_dict=True, **self.chat_template_kwargs)["input_ids"]
            for prompt, reply in zip(prompts, replies, strict=True)
        ]
        scores: list[float] = []
        for start in range(0, len(ids), self.batch_size):
            batch = self.tokenizer.pad({"input_ids": ids[start:start + self.batch_size]}, padding_side="right",
                                       return_tensors="pt").to(self.device)
            with self._torch.inference_mode():
                scores += self.model(**batch).logits[:, 0].float().tolist()
        return scores

    def __call__(self, prompts: list[Messages], completions: list[Messages | str], **_: Any) -> list[float]:
        return self.score(prompts, [_text(c) for c in completions])
