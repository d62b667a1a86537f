"""Valence buckets for the 32 Empathetic Dialogues emotion labels: the one table every loader uses.

Source of the positive/negative split: MIME (Majumder et al., 2020, "MIME: MIMicking Emotions for
Empathetic Response Generation", EMNLP). Its released code (github.com/declare-lab/MIME,
`model/VAE_noEmo_posterior.py`) lists the two clusters as indices into the emotion map of
`utils/data_loader.py`; decoded, they are `MIME_POSITIVE` (13 labels) and `MIME_NEGATIVE` (19 labels)
below. Together they cover all 32 labels exactly once.

Neutral is this project's choice, not MIME's. MIME has to put every label in one of two clusters,
so a few labels whose valence depends on the situation land on one side by convention (its code
even comments "anticipation is negative"). We take these four out of the MIME buckets and call
them neutral, so that per-valence results are not driven by labels whose sign is a coin toss:

- surprised: MIME positive; a surprise is as often bad news as good.
- anticipating: MIME negative; looking forward to a holiday and dreading a verdict both use it.
- sentimental, nostalgic: MIME negative; bittersweet by definition (fond memory, felt loss).

The result: 12 positive, 16 negative, 4 neutral.
"""

from __future__ import annotations

from typing import Literal

Valence = Literal["positive", "negative", "neutral"]

MIME_POSITIVE: frozenset[str] = frozenset(
    {
        "confident", "joyful", "grateful", "impressed", "proud", "excited", "trusting",
        "hopeful", "faithful", "prepared", "content", "surprised", "caring",
    }
)  # fmt: skip
MIME_NEGATIVE: frozenset[str] = frozenset(
    {
        "afraid", "angry", "annoyed", "anxious", "apprehensive", "ashamed", "devastated",
        "disappointed", "disgusted", "embarrassed", "furious", "guilty", "jealous", "lonely",
        "nostalgic", "sad", "sentimental", "terrified", "anticipating",
    }
)  # fmt: skip

NEUTRAL_EMOTIONS: frozenset[str] = frozenset({"surprised", "anticipating", "sentimental", "nostalgic"})
POSITIVE_EMOTIONS: frozenset[str] = MIME_POSITIVE - NEUTRAL_EMOTIONS
NEGATIVE_EMOTIONS: frozenset[str] = MIME_NEGATIVE - NEUTRAL_EMOTIONS

ED_EMOTIONS: tuple[str, ...] = tuple(sorted(MIME_POSITIVE | MIME_NEGATIVE))
"""The 32 Empathetic Dialogues emotion labels, sorted."""


def valence_of(emotion: str) -> Valence | None:
    """The bucket of an Empathetic Dialogues emotion label, or None when the label is not one of the 32."""
    label = emotion.strip().lower()
    if label in NEUTRAL_EMOTIONS:
        return "neutral"
    if label in POSITIVE_EMOTIONS:
        return "positive"
    if label in NEGATIVE_EMOTIONS:
        return "negative"
    return None
