"""Preference pairs from judged candidates, with margin filtering (Stage 1).

For every query, each unordered pair of scored candidates whose overall scores differ by at
least `margin` becomes one pair; the higher-scored candidate is `chosen`. With K candidates a
query yields at most K(K-1)/2 pairs (28 for the paper's K=8).

The rule, in full:

- A candidate without a row in `scores`, or with a null `overall`, failed judging. It is left
  out and never appears in a pair (a failure is not a score of 0).
- Two scores count as different only when they differ by more than `SCORE_TOLERANCE`, and the
  gap reaches the margin when `gap >= margin - SCORE_TOLERANCE`. The tolerance absorbs float
  noise in aggregated scores: 3.5 - 3.0 reaches a margin of 0.5, and 2.4 - 1.8 reaches 0.6
  although it evaluates to 0.5999999999999999. Ties are dropped even when `margin` is 0, as a
  tie says nothing about which reply is better.
- A pair whose two texts are equal after stripping surrounding whitespace is dropped: the
  reward model cannot learn from two identical replies with different labels. Whitespace is
  Unicode's; unlike Python's `str.strip()`, the ASCII separator controls U+001C-U+001F are kept.
- With `max_pairs_per_query`, each query keeps only its pairs with the largest margins, ties
  broken by (chosen_idx, rejected_idx).

Output rows are sorted by query_id, then margin (largest first), then chosen_idx, rejected_idx,
so the same inputs always give the same file. `build_pairs` is the step on artifacts: it applies
the rule to a run's candidates and judgments and adds the prompt each pair was answered to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from mascot.artifacts import Artifact, write_parquet
from mascot.config import Stage1Config
from mascot.judges.panel import aggregate_scores, check_failure_rate
from mascot.prompts import speaker_messages
from mascot.queries import Queries
from mascot.stats import binnable

SCORE_TOLERANCE = 1e-9

CANDIDATE_COLUMNS = ("query_id", "persona", "candidate_idx", "text")
SCORE_COLUMNS = ("query_id", "candidate_idx", "overall")
KEY = ["query_id", "candidate_idx"]

PAIR_SCHEMA = {
    "query_id": pl.String,
    "persona": pl.String,
    "chosen": pl.String,
    "rejected": pl.String,
    "chosen_score": pl.Float64,
    "rejected_score": pl.Float64,
    "margin": pl.Float64,
    "chosen_idx": pl.Int64,
    "rejected_idx": pl.Int64,
}


def build_preference_pairs(
    candidates: pl.DataFrame,
    scores: pl.DataFrame,
    *,
    margin: float,
    max_pairs_per_query: int | None = None,
) -> pl.DataFrame:
    """Preference pairs from scored candidates; see the module docstring for the rule.

    `candidates` needs query_id, persona, candidate_idx, text; `scores` needs query_id,
    candidate_idx, overall. Other columns are ignored. Returns the columns of `PAIR_SCHEMA`;
    the caller adds `prompt` by joining on query_id.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if max_pairs_per_query is not None and max_pairs_per_query < 1:
        raise ValueError(f"max_pairs_per_query must be >= 1 or None, got {max_pairs_per_query}")
    _check_frame("candidates", candidates, CANDIDATE_COLUMNS)
    _check_frame("scores", scores, SCORE_COLUMNS)

    scored = (
        candidates.lazy()
        .select(
            pl.col("query_id", "persona", "text").cast(pl.String),
            pl.col("candidate_idx").cast(pl.Int64),
        )
        .join(
            scores.lazy()
            .select(
                pl.col("query_id").cast(pl.String),
                pl.col("candidate_idx").cast(pl.Int64),
                pl.col("overall").cast(pl.Float64),
            )
            .drop_nulls("overall"),
            on=KEY,
            how="inner",
        )
        # Stripped once per candidate, not once per pair.
        .with_columns(stripped=pl.col("text").str.strip_chars())
    )

    # Joining each candidate with every candidate of its query and keeping the rows where the
    # left one scores higher yields each unordered pair once, with the left one chosen; ties
    # never pass. This is as fast as joining on candidate_idx < candidate_idx and then picking
    # the winner, and simpler.
    gap = pl.col("overall") - pl.col("overall_rejected")
    pairs = (
        scored.join(scored.drop("persona"), on="query_id", suffix="_rejected")
        .filter(
            gap > SCORE_TOLERANCE,
            gap >= margin - SCORE_TOLERANCE,
            pl.col("stripped") != pl.col("stripped_rejected"),
        )
        .select(
            "query_id",
            "persona",
            chosen="text",
            rejected="text_rejected",
            chosen_score="overall",
            rejected_score="overall_rejected",
            margin=gap,
            chosen_idx="candidate_idx",
            rejected_idx="candidate_idx_rejected",
        )
        .sort(
            ["query_id", "margin", "chosen_idx", "rejected_idx"],
            descending=[False, True, False, False],
        )
    )
    if max_pairs_per_query is not None:
        # Rows are sorted by margin within each query, so its first n rows are its largest.
        pairs = pairs.filter(pl.int_range(pl.len()).over("query_id") < max_pairs_per_query)
    return pairs.collect().cast(PAIR_SCHEMA)


def pairs_summary(pairs: pl.DataFrame, n_queries: int, *, bins: int | Sequence[float] = 10) -> dict:
    """Numbers to track per run: how many pairs, how they spread over queries, and their margins.

    `n_queries` is the number of queries that were judged, so queries that yielded no pair count
    towards the mean. `bins` goes to `numpy.histogram`; pass fixed edges to compare runs.
    Everything in the result is a plain int, float, None or list (JSON-ready).
    """
    per_query = pairs.group_by("query_id").len()
    if per_query.height > n_queries:
        raise ValueError(f"pairs cover {per_query.height} queries but n_queries is {n_queries}")
    margins = binnable(pairs["margin"].to_numpy())
    counts, edges = np.histogram(margins, bins=bins)
    return {
        "count": pairs.height,
        "n_queries": n_queries,
        "queries_with_pairs": per_query.height,
        "pairs_per_query_mean": pairs.height / n_queries if n_queries else 0.0,
        "pairs_per_query_max": int(per_query["len"].max()) if per_query.height else 0,
        "margin_mean": float(margins.mean()) if margins.size else None,
        "margin_histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
    }


def _check_frame(name: str, frame: pl.DataFrame, required: tuple[str, ...]) -> None:
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ValueError(f"{name} is missing columns {missing}; it has {frame.columns}")
    # A null key, persona or text could only be dropped silently further down.
    # A null `overall` is allowed: it marks a failed judgment.
    not_null = [column for column in required if column != "overall"]
    null_counts = frame.select(pl.col(not_null).null_count()).row(0, named=True)
    with_nulls = {column: n for column, n in null_counts.items() if n}
    if with_nulls:
        raise ValueError(f"{name} has null values in {with_nulls} (column: count)")
    keys = frame.select(KEY)
    duplicated = keys.filter(keys.is_duplicated())
    if duplicated.height:
        first = duplicated.row(0, named=True)
        raise ValueError(
            f"{name} has {duplicated.height} rows with a repeated (query_id, candidate_idx), e.g. {first}"
        )


def build_pairs(stage1: Stage1Config, queries: Queries, candidates: Artifact, judgments: Artifact,
                out: Path) -> Artifact:
    """Aggregate the panel's scores and keep the candidate pairs whose gap reaches the margin."""
    judged = judgments.read_parquet()
    check_failure_rate(judged, stage1.max_judge_failure_rate)
    scores = aggregate_scores(judged, stage1.aggregation)
    pairs = build_preference_pairs(candidates.read_parquet(), scores, margin=stage1.margin,
                                   max_pairs_per_query=stage1.max_pairs_per_query)
    # The prompt a reward model and the Speaker see: the persona's speaker prompt and the context.
    paired = set(pairs["query_id"].to_list())
    queried = [q for q in queries.load() if q.id in paired]
    prompts = pl.DataFrame(
        {"query_id": [q.id for q in queried], "prompt": [speaker_messages(q.persona, q.context) for q in queried]},
        schema={"query_id": pl.String, "prompt": pl.List(pl.Struct({"role": pl.String, "content": pl.String}))},
    )
    return write_parquet(pairs.join(prompts, on="query_id", how="left", maintain_order="left"), out)
