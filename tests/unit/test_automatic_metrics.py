"""Automatic metrics on hand-made strings."""

from __future__ import annotations

import pytest

from mascot.evaluation.metrics import (
    automatic_metrics,
    distinct_n,
    distinct_n_per_turn,
    mean_length,
    self_bleu,
    sentiment,
)


def test_distinct_n_by_hand():
    # words a b a b: 2 distinct of 4 unigrams; bigrams ab, ba, ab: 2 distinct of 3
    assert distinct_n(["A b", "a B"], 1) == pytest.approx(0.5)
    assert distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)
    assert distinct_n(["hello"], 2) is None


def test_self_bleu_is_one_for_identical_turns_and_near_zero_for_distinct_ones():
    same = "I hear how heavy this week has been for you."
    assert self_bleu([same, same, same]) == pytest.approx(1.0)
    distinct = ["I hear how heavy this week has been.", "What would a first small step look like?",
                "Growth often starts exactly where comfort ends."]
    assert self_bleu(distinct) < 0.1
    assert self_bleu(["only one turn"]) is None


def test_length_and_sentiment():
    assert mean_length(["one two", "three"]) == pytest.approx(1.5)
    assert sentiment(["This is wonderful, I am so happy for you!"]) > 0.5
    assert sentiment(["This is terrible and I hate it."]) < -0.5
    assert automatic_metrics([]) == {"distinct_1": None, "distinct_2": None, "distinct_1_per_turn": None,
                                     "distinct_2_per_turn": None, "self_bleu": None, "mean_length": None,
                                     "sentiment": None}


def test_distinct_per_turn_does_not_fall_with_the_number_of_turns():
    """Three turns of one speaker's habit against one: pooled, the repeated words pull the group's Distinct-1 down
    for having more turns; per turn, each turn is as varied as the single one."""
    single = ["I hear you and am here"]
    group = ["I hear you and am here", "I hear that this is hard", "I am here for you now"]
    assert distinct_n(single, 1) == pytest.approx(1.0) and distinct_n(group, 1) < 0.7
    assert distinct_n_per_turn(single, 1) == pytest.approx(1.0) == distinct_n_per_turn(group, 1)
    # words a b a b (2 of 4) and c d (2 of 2): per turn (0.5 + 1) / 2; a turn without a bigram is left out
    assert distinct_n_per_turn(["a b a b", "c d"], 1) == pytest.approx(0.75)
    assert distinct_n_per_turn(["a b a b", "c"], 2) == pytest.approx(2 / 3)
    assert distinct_n_per_turn(["c"], 2) is None
