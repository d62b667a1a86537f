"""Preference pairs: the margin rule, its edge cases, and agreement with a plain-loop oracle."""

from __future__ import annotations

import json
from itertools import combinations

import numpy as np
import polars as pl
import pytest
from benchmark_scripts import load_benchmark

from mascot.stage1.pairs import PAIR_SCHEMA, build_preference_pairs, pairs_summary

benchmark = load_benchmark("pairs")  # its reference_pairs is the oracle here

UNSCORED = object()  # marks a candidate whose judging failed: no row in `scores`


def frames(rows, query_id="q1", persona="anchor"):
    """candidates and scores for one query from (candidate_idx, text, overall) rows.

    `overall` may be None (null score) or UNSCORED (no score row).
    """
    candidates = pl.DataFrame(
        {
            "query_id": [query_id] * len(rows),
            "persona": [persona] * len(rows),
            "candidate_idx": [idx for idx, _, _ in rows],
            "text": [text for _, text, _ in rows],
        }
    )
    scored = [(idx, overall) for idx, _, overall in rows if overall is not UNSCORED]
    scores = pl.DataFrame(
        {
            "query_id": [query_id] * len(scored),
            "candidate_idx": [idx for idx, _ in scored],
            "overall": [overall for _, overall in scored],
        },
        schema={"query_id": pl.String, "candidate_idx": pl.Int64, "overall": pl.Float64},
    )
    return candidates, scores


def index_pairs(pairs: pl.DataFrame) -> list[tuple[int, int]]:
    return list(zip(pairs["chosen_idx"], pairs["rejected_idx"]))


def test_k8_distinct_scores_give_all_28_unordered_pairs():
    candidates, scores = frames([(i, f"reply {i}", 1.0 + 0.5 * i) for i in range(8)])
    pairs = build_preference_pairs(candidates, scores, margin=0.0)

    assert pairs.height == 28
    assert {frozenset(pair) for pair in index_pairs(pairs)} == {
        frozenset(p) for p in combinations(range(8), 2)
    }
    assert (pairs["chosen_score"] > pairs["rejected_score"]).all()
    assert (pairs["margin"] == pairs["chosen_score"] - pairs["rejected_score"]).all()
    assert pairs["chosen"].to_list() == [f"reply {i}" for i in pairs["chosen_idx"]]
    assert pairs.schema == pl.Schema(PAIR_SCHEMA)


def test_margin_is_inclusive_with_float_tolerance():
    assert 2.4 - 1.8 < 0.6  # the float noise the tolerance is for
    candidates, scores = frames([(0, "a", 2.4), (1, "b", 1.8), (2, "c", 1.85)])
    pairs = build_preference_pairs(candidates, scores, margin=0.6)
    assert index_pairs(pairs) == [(0, 1)]

    candidates, scores = frames([(0, "a", 3.5), (1, "b", 3.0), (2, "c", 3.01)])
    assert index_pairs(build_preference_pairs(candidates, scores, margin=0.5)) == [(0, 1)]


def test_ties_are_dropped_even_with_margin_zero():
    candidates, scores = frames([(0, "a", 3.0), (1, "b", 3.0), (2, "c", 4.0)])
    pairs = build_preference_pairs(candidates, scores, margin=0.0)
    assert sorted(index_pairs(pairs)) == [(2, 0), (2, 1)]


def test_identical_texts_after_strip_are_dropped():
    candidates, scores = frames([(0, "  same reply\n", 5.0), (1, "same reply", 1.0), (2, "other", 3.0)])
    pairs = build_preference_pairs(candidates, scores, margin=0.0)
    assert sorted(index_pairs(pairs)) == [(0, 2), (2, 1)]
    assert (pairs["chosen"].str.strip_chars() != pairs["rejected"].str.strip_chars()).all()


def test_failed_judgments_never_appear_in_a_pair():
    candidates, scores = frames([(0, "a", 5.0), (1, "b", UNSCORED), (2, "c", None), (3, "d", 1.0)])
    pairs = build_preference_pairs(candidates, scores, margin=0.0)
    assert index_pairs(pairs) == [(0, 3)]


def test_scores_without_a_candidate_are_ignored():
    candidates, scores = frames([(0, "a", 5.0), (1, "b", 1.0)])
    extra = pl.DataFrame({"query_id": ["q1", "q2"], "candidate_idx": [7, 0], "overall": [3.0, 3.0]})
    pairs = build_preference_pairs(candidates, pl.concat([scores, extra]), margin=0.0)
    assert index_pairs(pairs) == [(0, 1)]


def test_cap_keeps_largest_margins_and_breaks_ties_by_index():
    # Margins: (3,0)=3, (3,1)=2, (3,2)=2, (2,0)=1, (1,0)=1, (2,1) tie -> dropped.
    candidates, scores = frames([(0, "a", 1.0), (1, "b", 2.0), (2, "c", 2.0), (3, "d", 4.0)])
    full = build_preference_pairs(candidates, scores, margin=0.0)
    assert index_pairs(full) == [(3, 0), (3, 1), (3, 2), (1, 0), (2, 0)]
    assert full["margin"].to_list() == [3.0, 2.0, 2.0, 1.0, 1.0]

    capped = build_preference_pairs(candidates, scores, margin=0.0, max_pairs_per_query=2)
    assert index_pairs(capped) == [(3, 0), (3, 1)]
    assert build_preference_pairs(candidates, scores, margin=0.0, max_pairs_per_query=99).equals(full)


def test_cap_counts_only_pairs_that_survive_the_text_filter():
    candidates, scores = frames([(0, "a", 1.0), (1, "a", 5.0), (2, "b", 4.0)])
    capped = build_preference_pairs(candidates, scores, margin=0.0, max_pairs_per_query=1)
    assert index_pairs(capped) == [(2, 0)]


def test_cap_applies_per_query_and_order_is_deterministic():
    c1, s1 = frames([(i, f"x{i}", float(i)) for i in range(5)], query_id="q2", persona="beacon")
    c2, s2 = frames([(i, f"y{i}", float(i)) for i in range(5)], query_id="q1", persona="anchor")
    candidates, scores = pl.concat([c1, c2]), pl.concat([s1, s2])
    pairs = build_preference_pairs(candidates, scores, margin=0.0, max_pairs_per_query=3)

    assert pairs["query_id"].to_list() == ["q1"] * 3 + ["q2"] * 3
    assert pairs["persona"].to_list() == ["anchor"] * 3 + ["beacon"] * 3
    assert index_pairs(pairs) == [(4, 0), (3, 0), (4, 1)] * 2
    shuffled = build_preference_pairs(
        candidates.sample(fraction=1.0, shuffle=True, seed=1),
        scores.sample(fraction=1.0, shuffle=True, seed=2),
        margin=0.0,
        max_pairs_per_query=3,
    )
    assert shuffled.equals(pairs)


def test_other_columns_are_ignored_and_dtypes_normalised():
    candidates, scores = frames([(0, "a", 4.0), (1, "b", 2.0)])
    candidates = candidates.with_columns(pl.col("candidate_idx").cast(pl.Int32), model=pl.lit("m"))
    scores = scores.with_columns(pl.col("overall").cast(pl.Float32), judge=pl.lit("j"), feedback=pl.lit("ok"))
    pairs = build_preference_pairs(candidates, scores, margin=1.0)
    assert pairs.schema == pl.Schema(PAIR_SCHEMA)
    assert pairs.rows() == [("q1", "anchor", "a", "b", 4.0, 2.0, 2.0, 0, 1)]


def test_no_candidates_give_an_empty_frame_with_the_schema():
    candidates, scores = frames([])
    pairs = build_preference_pairs(candidates, scores, margin=0.5)
    assert pairs.height == 0
    assert pairs.schema == pl.Schema(PAIR_SCHEMA)


@pytest.mark.parametrize(
    ("frame", "columns"),
    [("candidates", ["persona", "text"]), ("scores", ["overall"])],
)
def test_missing_columns_name_the_frame_and_columns(frame, columns):
    candidates, scores = frames([(0, "a", 4.0)])
    inputs = {"candidates": candidates, "scores": scores}
    inputs[frame] = inputs[frame].drop(columns)
    with pytest.raises(ValueError, match=frame) as error:
        build_preference_pairs(**inputs, margin=0.0)
    assert all(column in str(error.value) for column in columns)


@pytest.mark.parametrize("frame", ["candidates", "scores"])
def test_duplicate_keys_are_rejected(frame):
    candidates, scores = frames([(0, "a", 4.0), (1, "b", 2.0)])
    inputs = {"candidates": candidates, "scores": scores}
    inputs[frame] = pl.concat([inputs[frame], inputs[frame].head(1)])
    with pytest.raises(ValueError, match=rf"{frame} has 2 rows with a repeated \(query_id, candidate_idx\)"):
        build_preference_pairs(**inputs, margin=0.0)


def test_duplicate_score_rows_are_rejected_even_when_null():
    candidates, scores = frames([(0, "a", 4.0), (1, "b", 2.0)])
    scores = pl.concat([scores, pl.DataFrame({"query_id": ["q1"], "candidate_idx": [0], "overall": [None]})])
    with pytest.raises(ValueError, match="scores has 2 rows"):
        build_preference_pairs(candidates, scores, margin=0.0)


def test_null_keys_or_texts_are_rejected():
    candidates, scores = frames([(0, "a", 4.0), (1, "b", 2.0)])
    candidates = candidates.with_columns(text=pl.Series(["a", None]))
    with pytest.raises(ValueError, match=r"candidates has null values in \{'text': 1\}"):
        build_preference_pairs(candidates, scores, margin=0.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [({"margin": -0.1}, "margin must be >= 0"), ({"margin": 0.0, "max_pairs_per_query": 0}, "max_pairs")],
)
def test_bad_options_are_rejected(options, message):
    candidates, scores = frames([(0, "a", 4.0)])
    with pytest.raises(ValueError, match=message):
        build_preference_pairs(candidates, scores, **options)


@pytest.mark.parametrize("seed", range(12))
def test_matches_the_plain_loop_reference_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 9))
    margin = float(rng.choice([0.0, 0.2, 0.5, 1.0, 1.4]))
    cap = [None, 1, 3, 40][seed % 4]
    candidates, scores = benchmark.generate_inputs(
        60, k, seed, failed_rate=0.15, null_rate=0.1, duplicate_rate=0.25
    )

    pairs = build_preference_pairs(candidates, scores, margin=margin, max_pairs_per_query=cap)
    expected = benchmark.reference_pairs(
        candidates.to_dicts(), scores.to_dicts(), margin=margin, max_pairs_per_query=cap
    )
    assert pairs.to_dicts() == expected

    # The rule's invariants, checked directly as well.
    per_query = pairs.group_by("query_id").len()["len"]
    assert per_query.max() is None or per_query.max() <= min(k * (k - 1) // 2, cap or k * k)
    assert (pairs["margin"] >= margin - 1e-9).all()
    assert (pairs["chosen_score"] > pairs["rejected_score"]).all()
    assert (pairs["chosen"].str.strip_chars() != pairs["rejected"].str.strip_chars()).all()
    judged = scores.drop_nulls("overall").select("query_id", "candidate_idx")
    for side in ("chosen_idx", "rejected_idx"):
        used = pairs.select("query_id", candidate_idx=side)
        assert used.join(judged, on=["query_id", "candidate_idx"], how="anti").height == 0


def test_summary_counts_queries_without_pairs():
    c1, s1 = frames([(0, "a", 1.0), (1, "b", 2.0), (2, "c", 4.0)], query_id="q1")
    c2, s2 = frames([(0, "a", 3.0), (1, "b", 3.0)], query_id="q2")  # a tie: no pairs
    pairs = build_preference_pairs(pl.concat([c1, c2]), pl.concat([s1, s2]), margin=0.0)
    summary = pairs_summary(pairs, n_queries=2, bins=[0.0, 1.5, 4.0])

    assert summary == {
        "count": 3,
        "n_queries": 2,
        "queries_with_pairs": 1,
        "pairs_per_query_mean": 1.5,
        "pairs_per_query_max": 3,
        "margin_mean": 2.0,
        "margin_histogram": {"edges": [0.0, 1.5, 4.0], "counts": [1, 2]},
    }
    json.dumps(summary)


def test_summary_of_margins_that_differ_only_in_float_noise():
    """0.4 - 0.1 and 0.7 - 0.4 are 0.3 but for their last bits: numpy alone finds no room for 10 bins between them."""
    c1, s1 = frames([(0, "a", 0.1), (1, "b", 0.4)], query_id="q1")
    c2, s2 = frames([(0, "a", 0.4), (1, "b", 0.7)], query_id="q2")
    pairs = build_preference_pairs(pl.concat([c1, c2]), pl.concat([s1, s2]), margin=0.0)
    assert pairs["margin"].n_unique() == 2  # the float noise the summary must survive
    summary = pairs_summary(pairs, n_queries=2)
    assert summary["count"] == 2 and sum(summary["margin_histogram"]["counts"]) == 2


def test_summary_of_no_pairs_and_of_too_few_queries():
    empty = build_preference_pairs(*frames([]), margin=0.0)
    summary = pairs_summary(empty, n_queries=0)
    assert summary["count"] == 0 and summary["pairs_per_query_max"] == 0 and summary["margin_mean"] is None
    assert sum(summary["margin_histogram"]["counts"]) == 0
    json.dumps(summary)

    pairs = build_preference_pairs(*frames([(0, "a", 1.0), (1, "b", 2.0)]), margin=0.0)
    with pytest.raises(ValueError, match="n_queries"):
        pairs_summary(pairs, n_queries=0)
