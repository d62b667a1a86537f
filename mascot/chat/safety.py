"""The safety guard that both chat surfaces (terminal and web page) go through.

Four checks, each a plain function of text, so that the session cannot skip one and tests can read
them directly:

- `screen` (and `screen_message`, its rules and classifier): does the person's message suggest a crisis?
  The rule set (`safety.yaml`, documented in docs/chat.md) is organised by the C-SSRS screen's categories
  plus self-harm and danger from others, each with its own patterns and narrow exceptions; a moderation
  model (`mascot.chat.moderation`) and a classifier named in config can flag what the rules miss, and a
  failed moderation check flags the message. A flagged message is answered by `crisis_reply`, never by a
  persona.
- `reply_breaks`: does a companion's reply claim to be human or a professional, or give method or means
  of self-harm? Such a reply is never shown; the prompt alone cannot promise that, so every reply is
  checked. While a reply streams, `shown_length` says how much of it can be shown: all but the end from
  which a broken rule may still be forming (a partial match, which the `regex` package finds).
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
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from mascot.chat.moderation import Moderation, ModerationVerdict
from mascot.config import CrisisClassifierConfig
from mascot.yamlio import FieldError, load_validated

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


class CrisisCategory(BaseModel):
    """One kind of crisis the guard screens for: its patterns, and the exception classes that apply to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str = Field(min_length=1, description="What it is, as /why and the transcript's reader see it.")
    patterns: list[Pattern] = Field(min_length=1, description="A match flags the message.")
    exceptions: list[str] = Field(default_factory=list, description="Names of `exceptions` classes: a match "
                                  "wholly inside one of their spans does not count.")


class SafetyRules(BaseModel):
    """safety.yaml: the rule set and the texts the guard shows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    notice: str = Field(min_length=1, description="Shown before every conversation.")
    crisis: dict[str, CrisisCategory] = Field(min_length=1, description="Crisis categories (C-SSRS, self-harm, "
                                              "danger from others), each with its patterns and exceptions.")
    exceptions: dict[str, list[Pattern]] = Field(default_factory=dict, description="Classes of phrases that only "
                                                 "look like a crisis (hyperbole, fiction...), by name.")
    crisis_reply: str = Field(min_length=1, description="The guard's answer to a crisis message.")
    resources: list[str] = Field(min_length=1, description="Crisis resources, listed after the answer.")
    reply_rules: dict[str, list[Pattern]] = Field(min_length=1, description="What a companion's reply may never "
                                                  "say (claims to be human or a professional, means of self-harm).")
    withheld_reply: str = Field(min_length=1, description="Shown instead of a reply that kept breaking a reply rule.")

    @model_validator(mode="after")
    def _exceptions_exist(self) -> SafetyRules:
        for name, category in self.crisis.items():
            for index, exception in enumerate(category.exceptions):
                if exception not in self.exceptions:
                    raise FieldError(("crisis", name, "exceptions", index), f"no exception class {exception!r}; "
                                     f"`exceptions` has {sorted(self.exceptions) or 'none'}")
        return self

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


@cache
def _compiled(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


def _spans(patterns: list[str], text: str) -> list[tuple[int, int]]:
    return [match.span() for pattern in patterns for match in _compiled(pattern).finditer(text)]


def _matches(patterns: dict[str, list[str]], text: str, spared: dict[str, list[tuple[int, int]]] | None = None,
             ) -> list[str]:
    """The rules that match outside their category's spared spans, each as 'category #n' (its place in the
    file's list)."""
    spared = spared or {}
    return [f"{category} #{number}" for category, listed in patterns.items()
            for number, pattern in enumerate(listed, 1)
            if any(not any(start <= m.start() and m.end() <= end for start, end in spared.get(category, ()))
                   for m in _compiled(pattern).finditer(text))]


def crisis_rules(text: str, rules: SafetyRules) -> list[str]:
    """The crisis rules a message matches, each outside the spans of its own category's exceptions. The exceptions
    are looked for only where a rule matched, and only those of its category: most messages match none, and the
    exception classes are the costliest patterns to run."""
    folded = normalized(text)
    found = {(category, number): spans for category, spec in rules.crisis.items()
             for number, pattern in enumerate(spec.patterns, 1) if (spans := _spans([pattern], folded))}
    needed = {name for category, _ in found for name in rules.crisis[category].exceptions}
    exception_spans = {name: _spans(rules.exceptions[name], folded) for name in needed}
    return [f"{category} #{number}" for (category, number), spans in found.items()
            if any(not any(begin <= start and end <= stop for name in rules.crisis[category].exceptions
                           for begin, stop in exception_spans[name]) for start, end in spans)]


@dataclass(frozen=True)
class Screening:
    """Why a message was flagged: the rules it matched, the classifier's score where one ran, and the moderation
    layer's verdict where one is configured (a failed check flags the message: the guard fails closed)."""

    rules: list[str]
    classifier_score: float | None = None
    classifier_flagged: bool = False
    moderation: ModerationVerdict | None = None

    @property
    def crisis(self) -> bool:
        return bool(self.rules) or self.classifier_flagged or bool(self.moderation and self.moderation.flagged)

    @property
    def categories(self) -> list[str]:
        """The crisis categories the rules found, each once, in the rule file's order."""
        return list(dict.fromkeys(rule.split(" #")[0] for rule in self.rules))


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
    """Whether the person's message suggests a crisis by the rules, or by the classifier at its threshold."""
    matched = crisis_rules(text, rules)
    if classifier is None:
        return Screening(matched)
    score = classifier.score(text)
    return Screening(matched, score, score >= classifier.config.threshold)


async def screen(text: str, rules: SafetyRules, classifier: CrisisClassifier | None = None,
                 moderation: Moderation | None = None) -> Screening:
    """`screen_message`, with the moderation layer run on every message beside the rules where one is configured:
    either flags it, and a moderation check that fails flags it too."""
    screening = screen_message(text, rules, classifier)
    if moderation is None:
        return screening
    return Screening(screening.rules, screening.classifier_score, screening.classifier_flagged,
                     await moderation.check(text))


def reply_breaks(text: str, rules: SafetyRules) -> list[str]:
    """The reply rules a companion's reply breaks (a claim to be human or a professional, means of self-harm):
    none for a reply that may be shown."""
    return _matches(rules.reply_rules, normalized(text))


def shown_length(text: str, rules: SafetyRules) -> int:
    """How much of a reply being generated can be shown: up to where a broken rule may still be forming, the
    earliest start of a partial match (one that reaches the end of the text so far) of any reply rule."""
    folded = normalized(text)
    return min((match.start() for patterns in rules.reply_rules.values() for pattern in patterns
                for match in _compiled(pattern).finditer(folded, partial=True) if match.partial), default=len(text))


def clean_message(text: str) -> str:
    """The person's message as conversation only: no chat-template control tokens, no control characters
    (newlines and tabs stay), no surrounding whitespace."""
    text = CONTROL_TOKEN.sub("", text)
    return "".join(c for c in text if c in "\n\t" or unicodedata.category(c)[0] != "C").strip()


def one_line(text: str) -> str:
    return " ".join(text.split())
