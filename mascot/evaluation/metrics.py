"""Automatic metrics of one conversation's companion turns: Distinct-n, Self-BLEU, length, sentiment.

Each metric is computed per conversation (one held-out context played by one system), so that the
statistics can resample contexts like every other score. Words are nltk's `wordpunct_tokenize`
(a regular expression: no downloaded data), lowercased. BLEU is nltk's, with its method-1
smoothing (the group heuristic judge's formula), since companion turns are short and an unsmoothed
4-gram precision is 0 for most of them. Sentiment is VADER's compound score (-1 to 1), from the vaderSentiment package, which ships
its lexicon.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from statistics import fmean

AUTOMATIC_METRICS = ("distinct_1", "distinct_2", "distinct_1_per_turn", "distinct_2_per_turn", "self_bleu",
                     "mean_length", "sentiment")


def words(text: str) -> list[str]:
    from nltk.tokenize import wordpunct_tokenize

    return [word.lower() for word in wordpunct_tokenize(text)]


def distinct_n(turns: Sequence[str], n: int) -> float | None:
    """Distinct n-grams over all n-grams of the turns (Li et al., 2016); None when there is none."""
    from nltk.util import ngrams

    grams = [gram for turn in turns for gram in ngrams(words(turn), n)]
    return len(set(grams)) / len(grams) if grams else None


def distinct_n_per_turn(turns: Sequence[str], n: int) -> float | None:
    """The mean over turns of each turn's Distinct-n; None when no turn has an n-gram.

    Distinct-n over a whole conversation falls as its text grows (more words, more chances to repeat one), and a
    group writes several turns per block where a single assistant writes one, so the pooled figure is not
    comparable between the two kinds; a turn's own figure is."""
    values = [value for value in (distinct_n([turn], n) for turn in turns) if value is not None]
    return fmean(values) if values else None


def self_bleu(turns: Sequence[str]) -> float | None:
    """Mean BLEU-4 of each turn against the conversation's other turns: 1 when the agents repeat
    each other, near 0 when they say different things. None with fewer than two non-empty turns.
    The group heuristic judge's own formula, on this module's words."""
    from mascot.judges.group import self_bleu as bleu_against_the_others

    tokenized = [tokens for tokens in map(words, turns) if tokens]
    return bleu_against_the_others(tokenized) if len(tokenized) >= 2 else None


def mean_length(turns: Sequence[str]) -> float | None:
    """Words per turn."""
    return fmean(len(words(turn)) for turn in turns) if turns else None


@cache
def _vader():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def sentiment(turns: Sequence[str]) -> float | None:
    """Mean VADER compound score of the turns."""
    return fmean(_vader().polarity_scores(turn)["compound"] for turn in turns) if turns else None


def automatic_metrics(turns: Sequence[str]) -> dict[str, float | None]:
    """Every automatic metric of one conversation's companion turns (None where undefined)."""
    return {"distinct_1": distinct_n(turns, 1), "distinct_2": distinct_n(turns, 2),
            "distinct_1_per_turn": distinct_n_per_turn(turns, 1), "distinct_2_per_turn": distinct_n_per_turn(turns, 2),
            "self_bleu": self_bleu(turns), "mean_length": mean_length(turns), "sentiment": sentiment(turns)}
