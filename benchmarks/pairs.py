"""Benchmark: preference pairs with polars against a plain Python loop over the same rule.

    python benchmarks/pairs.py [--queries 125000 --k 8 --seed 0 --margin 0.5 --repeats 5]

Generates seeded candidates and judge scores, times `build_preference_pairs` (best and median of
`--repeats` runs) and `reference_pairs` (one run), checks that both give the same rows in the same
order, and prints the wall times and the speed ratio. `reference_pairs` is also the oracle of
tests/unit/test_pairs.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from itertools import combinations

import numpy as np
import polars as pl

from mascot.stage1.pairs import SCORE_TOLERANCE, build_preference_pairs

PERSONAS = ("anchor", "catalyst", "beacon")


def generate_inputs(
    n_queries: int,
    k: int,
    seed: int,
    *,
    failed_rate: float = 0.03,
    null_rate: float = 0.01,
    duplicate_rate: float = 0.05,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Candidates and scores shaped like stage1/candidates.parquet and stage1/judgments.parquet.

    Scores are means of 5 criteria scored 1-5, so ties and gaps with float noise both occur.
    Some candidates repeat their query's first text (some with extra whitespace), some have no
    score row (judging failed) and some have a null overall.
    """
    rng = np.random.default_rng(seed)
    n = n_queries * k
    query = np.repeat(np.arange(n_queries), k)
    idx = np.tile(np.arange(k), n_queries)
    duplicate = (rng.random(n) < duplicate_rate) & (idx > 0)
    padding = np.where(rng.random(n) < 0.5, "  \n", "")
    candidates = pl.DataFrame(
        {
            "query": query,
            "persona": np.array(PERSONAS)[query % len(PERSONAS)],
            "candidate_idx": idx,
            # A duplicate repeats the query's first text, so its stripped text matches candidate 0.
            "text_idx": np.where(duplicate, 0, idx),
            "padding": np.where(duplicate, padding, ""),
        }
    ).select(
        pl.format("q{}", "query").alias("query_id"),
        "persona",
        "candidate_idx",
        (pl.format("reply to {} number {}", "query", "text_idx") + pl.col("padding")).alias("text"),
    )
    overall = rng.integers(1, 6, size=(n, 5)).mean(axis=1)
    scores = (
        candidates.select("query_id", "candidate_idx")
        .with_columns(
            overall=pl.when(pl.Series(rng.random(n) < null_rate)).then(None).otherwise(pl.Series(overall))
        )
        .filter(pl.Series(rng.random(n) >= failed_rate))
    )
    return candidates, scores


def reference_pairs(
    candidates: list[dict], scores: list[dict], *, margin: float, max_pairs_per_query: int | None = None
) -> list[dict]:
    """The pair rule of mascot.stage1.pairs written as plain loops, over lists of row dicts."""
    overall = {
        (row["query_id"], row["candidate_idx"]): row["overall"]
        for row in scores
        if row["overall"] is not None
    }
    by_query = defaultdict(list)
    for row in candidates:
        if (row["query_id"], row["candidate_idx"]) in overall:
            by_query[row["query_id"]].append(row)

    pairs = []
    for query_id in sorted(by_query):
        query_pairs = []
        for a, b in combinations(sorted(by_query[query_id], key=lambda row: row["candidate_idx"]), 2):
            score_a = overall[(query_id, a["candidate_idx"])]
            score_b = overall[(query_id, b["candidate_idx"])]
            gap = abs(score_a - score_b)
            if gap <= SCORE_TOLERANCE or gap < margin - SCORE_TOLERANCE:
                continue
            if a["text"].strip() == b["text"].strip():
                continue
            chosen, rejected = (a, b) if score_a > score_b else (b, a)
            query_pairs.append(
                {
                    "query_id": query_id,
                    "persona": a["persona"],
                    "chosen": chosen["text"],
                    "rejected": rejected["text"],
                    "chosen_score": max(score_a, score_b),
                    "rejected_score": min(score_a, score_b),
                    "margin": gap,
                    "chosen_idx": chosen["candidate_idx"],
                    "rejected_idx": rejected["candidate_idx"],
                }
            )
        query_pairs.sort(key=lambda pair: (-pair["margin"], pair["chosen_idx"], pair["rejected_idx"]))
        pairs.extend(query_pairs[:max_pairs_per_query])
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=125_000, help="number of (context, persona) queries")
    parser.add_argument("--k", type=int, default=8, help="candidates per query")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated inputs")
    parser.add_argument("--margin", type=float, default=0.5, help="minimum score gap of a pair")
    parser.add_argument("--max-pairs-per-query", type=int, default=None, help="cap per query (default: none)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the polars version")
    args = parser.parse_args()

    candidates, scores = generate_inputs(args.queries, args.k, args.seed)
    scored_per_query = scores.drop_nulls("overall").group_by("query_id").len()["len"]
    print(
        f"{args.queries:,} queries x {args.k} candidates = {candidates.height:,} candidates, "
        f"{scored_per_query.sum():,} scored, "
        f"{(scored_per_query * (scored_per_query - 1) // 2).sum():,} unordered pairs before filtering; "
        f"margin {args.margin}, cap {args.max_pairs_per_query}"
    )
    options = {"margin": args.margin, "max_pairs_per_query": args.max_pairs_per_query}

    polars_times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        pairs = build_preference_pairs(candidates, scores, **options)
        polars_times.append(time.perf_counter() - start)

    # The loop gets its input as Python rows already; converting the frames is not timed.
    candidate_rows, score_rows = candidates.to_dicts(), scores.to_dicts()
    start = time.perf_counter()
    expected = reference_pairs(candidate_rows, score_rows, **options)
    python_time = time.perf_counter() - start

    columns = list(pairs.columns)
    same = pairs.rows() == [tuple(row[column] for column in columns) for row in expected]
    best, median = min(polars_times), statistics.median(polars_times)
    print(f"pairs: {pairs.height:,} (pure Python: {len(expected):,}); same rows in same order: {same}")
    print(
        f"polars {best:.2f} s (best of {args.repeats}; median {median:.2f} s), "
        f"pure Python {python_time:.2f} s, {python_time / best:.1f}x faster"
    )
    if not same:
        sys.exit("MISMATCH: polars and pure Python disagree")


if __name__ == "__main__":
    main()
