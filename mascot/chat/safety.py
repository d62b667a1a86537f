"""The safety guard that both chat surfaces (terminal and web page) go through.

Four checks, each a plain function of text, so that the session cannot skip one and tests can read
them directly:

- `screen_message`: does the person's message suggest a crisis or self-harm? The rule set
  (`safety.yaml`, documented in docs/chat.md) decides, and an optional classifier named in config
  can flag what the rules miss. A flagged message is answered by `crisis_reply`, never by a persona.
- `reply_claim`: does a companion's reply claim to be human or a professional? Such a reply is never
  shown; the prompt alone cannot promise that, so every reply is checked. While a reply streams,
  `unclaimed_length` says how much of it can be shown: all but the end from which a claim may still be
  forming (a partial match of a claim pattern, which the `regex` package finds).
- `clean_message`: what a person types is conversation, nothing else. Chat-template control tokens
  (`<|im_start|>system`) are removed, since a tokenizer would read them as a real system turn, and
  control characters with them.
- `one_line`: in the Director's transcript each message is one line, so a message cannot start a
  line that looks like another speaker's turn.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import regex
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mascot.config import CrisisClassifierConfig
from mascot.yamlio import load_validated

DEFAULT_RULES = Path(__file__).with_name("safety.yaml")
# `<|im_start|>`, `<|endoftext|>`, `<|eot_id|>`: the control tokens of the chat templates in use.
CONTROL_TOKEN = regex.compile(r"<\|[^|<>\s]{1,40}\|>")


def _pattern(value: str) -> str:
    try:
        regex.compile(value)
    except regex.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return value


Pattern = Annotated[str, AfterValidator(_pattern)]


class SafetyRules(BaseModel):
    """safety.yaml: the rule set and the texts the guard shows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    notice: str = Field(min_length=1, description="Shown before every conversation.")
    crisis: dict[str, list[Pattern]] = Field(min_length=1, description="Crisis patterns, by category.")
    not_crisis: list[Pattern] = Field(default_factory=list, description="Phrases that only look like a crisis.")
    crisis_reply: str = Field(min_length=1, description="The guard's answer to a crisis message.")
    resources: list[str] = Field(min_length=1, description="Crisis resources, listed after the answer.")
    reply_claims: dict[str, list[Pattern]] = Field(min_length=1, description="Claims a reply may not make.")
    withheld_reply: str = Field(min_length=1, description="Shown instead of a reply that kept making a claim.")

    def crisis_text(self) -> str:
        return "\n".join([self.crisis_reply.strip(), *(f"- {line}" for line in self.resources)])


@cache
def load_rules(path: Path = DEFAULT_RULES) -> SafetyRules:
    return load_validated(path, SafetyRules)


def normalized(text: str) -> str:
    """What the patterns read: each character in NFKC and lower case, apostrophes straight, every space a
    plain one. One character for one, so a match's place in it is its place in the text."""
    return "".join(_fold(c) for c in text)


def _fold(c: str) -> str:
    if c.isspace():
        return " "
    if c in "\u2018\u2019":
        return "'"
    folded = unicodedata.normalize("NFKC", c).lower()
    return folded if len(folded) == 1 else c


def _matches(patterns: dict[str, list[str]], text: str, exceptions: list[str] = ()) -> list[str]:
    """The rules that match outside the exceptions' spans, each as 'category #n' (its place in the file's list)."""
    spared = [match.span() for pattern in exceptions for match in regex.finditer(pattern, text)]
    return [f"{category} #{number}" for category, listed in patterns.items()
            for number, pattern in enumerate(listed, 1)
            if any(not any(start <= m.start() and m.end() <= end for start, end in spared)
                   for m in regex.finditer(pattern, text))]


@dataclass(frozen=True)
class Screening:
    """Why a message was flagged: the rules it matched, and the classifier's score where one ran."""

    rules: list[str]
    classifier_score: float | None = None
    classifier_flagged: bool = False

    @property
    def crisis(self) -> bool:
        return bool(self.rules) or self.classifier_flagged


class CrisisClassifier:
    """A transformers text-classification model; loaded at the first message, once per process."""

    def __init__(self, config: CrisisClassifierConfig):
        self.config = config
        self._pipeline: Any = None

    def score(self, text: str) -> float:
        if self._pipeline is None:
            from transformers import pipeline

            self._pipeline = pipeline("text-classification", model=self.config.model, device=self.config.device,
                                      top_k=None)
        scores = {entry["label"]: entry["score"] for entry in self._pipeline([text], truncation=True)[0]}
        if self.config.label not in scores:
            raise ValueError(f"chat.safety.classifier.label is {self.config.label!r}, but {self.config.model} has the "
                             f"labels {sorted(scores)}")
        return float(scores[self.config.label])


def screen_message(text: str, rules: SafetyRules, classifier: CrisisClassifier | None = None) -> Screening:
    """Whether the person's message suggests a crisis: any rule, or the classifier at its threshold."""
    matched = _matches(rules.crisis, normalized(text), rules.not_crisis)
    if classifier is None:
        return Screening(matched)
    score = classifier.score(text)
    return Screening(matched, score, score >= classifier.config.threshold)


def reply_claim(text: str, rules: SafetyRules) -> list[str]:
    """The claims a companion's reply makes to be human or a professional (none for a reply that may be shown)."""
    return _matches(rules.reply_claims, normalized(text))


def unclaimed_length(text: str, rules: SafetyRules) -> int:
    """How much of a reply being generated can be shown: up to where a claim may still be forming, the earliest
    start of a partial match (one that reaches the end of the text so far) of any claim pattern."""
    folded = normalized(text)
    return min((match.start() for patterns in rules.reply_claims.values() for pattern in patterns
                for match in regex.finditer(pattern, folded, partial=True) if match.partial), default=len(text))


def clean_message(text: str) -> str:
    """The person's message as conversation only: no chat-template control tokens, no control characters
    (newlines and tabs stay), no surrounding whitespace."""
    text = CONTROL_TOKEN.sub("", text)
    return "".join(c for c in text if c in "\n\t" or unicodedata.category(c)[0] != "C").strip()


def one_line(text: str) -> str:
    return " ".join(text.split())
