"""Statistics every reported number carries: n, spread and a confidence interval.

Proportions get Wilson score intervals; paired comparisons get a bootstrap interval of the mean
difference, resampling the pairs (scipy.stats.bootstrap, BCa). All functions return plain dicts
that go straight into metrics.json.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def proportion(successes: int, n: int, confidence: float = 0.95) -> dict:
    """A share with its Wilson score interval (sensible at small n and near 0 or 1)."""
    if n == 0:
        return {"value": None, "n": 0, "ci_low": None, "ci_high": None, "confidence": confidence}
    from scipy.stats import binomtest

    interval = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return {"value": successes / n, "n": n, "ci_low": float(interval.low), "ci_high": float(interval.high),
            "confidence": confidence}


def describe(values: Sequence[float]) -> dict:
    """n, mean, sd (n-1) and the quartiles of a sample."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return {"n": 0, "mean": None, "sd": None, "min": None, "q25": None, "median": None, "q75": None, "max": None}
    q = np.quantile(array, [0.0, 0.25, 0.5, 0.75, 1.0])
    return {"n": int(array.size), "mean": float(array.mean()), "sd": float(array.std(ddof=1)) if array.size > 1 else 0.0,
            "min": float(q[0]), "q25": float(q[1]), "median": float(q[2]), "q75": float(q[3]), "max": float(q[4])}


def binnable(values: Sequence[float]) -> np.ndarray:
    """`values` rounded to 9 decimals, for numpy to bin: values equal but for float noise (0.4 - 0.1 and 0.7 - 0.4, two
    margins of mean scores) leave it no room for its bins between them, and it raises ("Too many bins for data
    range")."""
    return np.asarray(values, dtype=float).round(9)


def histogram(values: Sequence[float], bins: int = 10) -> dict:
    counts, edges = np.histogram(binnable(values), bins=bins)
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def paired_difference(before: Sequence[float], after: Sequence[float], confidence: float = 0.95,
                      resamples: int = 10000, seed: int = 0) -> dict:
    """Mean of after - before over matched items, with a bootstrap interval that resamples the pairs."""
    before_array, after_array = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if before_array.shape != after_array.shape:
        raise ValueError(f"paired samples differ in size: {before_array.size} before, {after_array.size} after")
    differences = after_array - before_array
    result = {"mean": None, "sd": None, "n": int(differences.size), "ci_low": None, "ci_high": None,
              "confidence": confidence, "method": "paired bootstrap (BCa) of the mean difference"}
    if differences.size == 0:
        return result
    result["mean"] = float(differences.mean())
    result["sd"] = float(differences.std(ddof=1)) if differences.size > 1 else 0.0
    if differences.size < 2 or np.ptp(differences) == 0:
        # Every resample has the same mean: the interval is that point (BCa is undefined there).
        result["ci_low"] = result["ci_high"] = result["mean"]
        return result
    from scipy.stats import bootstrap

    interval = bootstrap((differences,), np.mean, confidence_level=confidence, n_resamples=resamples,
                         method="BCa", rng=np.random.default_rng(seed)).confidence_interval
    result["ci_low"], result["ci_high"] = float(interval.low), float(interval.high)
    return result


def mean_over_runs(values: Sequence[float], confidence: float = 0.95) -> dict:
    """The mean of a few independent runs' figures with Student's t interval (n - 1 degrees of freedom): with runs
    too few to resample (three training runs), a bootstrap's interval spans little more than their range."""
    array = np.asarray(values, dtype=float)
    result = {"mean": float(array.mean()) if array.size else None, "sd": None, "n": int(array.size), "ci_low": None,
              "ci_high": None, "confidence": confidence, "method": "Student's t interval over runs"}
    if array.size < 2:
        return result
    from scipy.stats import t

    result["sd"] = float(array.std(ddof=1))
    half = float(t.ppf(1 - (1 - confidence) / 2, array.size - 1)) * result["sd"] / np.sqrt(array.size)
    return result | {"ci_low": result["mean"] - half, "ci_high": result["mean"] + half}


def clustered_mean(values: Sequence[float], clusters: Sequence[str], confidence: float = 0.95,
                   resamples: int = 2000, seed: int = 0) -> dict:
    """A mean (a share, for 0/1 values) with a percentile bootstrap interval that resamples whole clusters.

    Items of one cluster (the pairs of one context, the samples of one state) are not independent, so
    an interval that resamples items is too narrow; this one resamples the clusters, with their items. From one
    cluster there is no spread between clusters to resample: the interval is None, not a point.
    """
    array = np.asarray(values, dtype=float)
    result = {"value": None, "n": int(array.size), "clusters": 0, "ci_low": None, "ci_high": None,
              "confidence": confidence, "method": "percentile bootstrap over clusters"}
    if array.size == 0:
        return result
    if len(clusters) != array.size:
        raise ValueError(f"{array.size} values but {len(clusters)} cluster labels")
    labels, index = np.unique(np.asarray(clusters, dtype=str), return_inverse=True)
    sums, counts = np.bincount(index, weights=array), np.bincount(index).astype(float)
    result["value"], result["clusters"] = float(array.mean()), int(labels.size)
    if labels.size < 2:
        return result
    picks = np.random.default_rng(seed).integers(0, labels.size, size=(resamples, labels.size))
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
    tail = (1 - confidence) / 2
    result["ci_low"], result["ci_high"] = (float(q) for q in np.quantile(means, [tail, 1 - tail]))
    return result


def crossed_clustered_mean(values: Sequence[float], rows: Sequence[str], columns: Sequence[str],
                           confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """A mean with a percentile bootstrap interval that resamples two crossed sources of variance at once.

    Human ratings vary with the item (the context) and with the rater, and neither is nested in the other:
    every rater rates many contexts and every context is rated by several raters. Resampling only the
    contexts treats the raters as fixed, and the interval says nothing about other raters. Each resample
    draws the row clusters and the column clusters independently, with replacement, and weighs an item by
    how often its row was drawn times how often its column was (the pigeonhole bootstrap of Owen 2007).
    A resample that keeps no item (possible when the design is sparse) is skipped and counted.
    """
    array = np.asarray(values, dtype=float)
    result = {"value": None, "n": int(array.size), "rows": 0, "columns": 0, "ci_low": None, "ci_high": None,
              "confidence": confidence, "empty_resamples": 0,
              "method": "percentile bootstrap over two crossed clusterings (rows x columns)"}
    if array.size == 0:
        return result
    if not len(rows) == len(columns) == array.size:
        raise ValueError(f"{array.size} values but {len(rows)} row and {len(columns)} column labels")
    row_labels, row_index = np.unique(np.asarray(rows, dtype=str), return_inverse=True)
    column_labels, column_index = np.unique(np.asarray(columns, dtype=str), return_inverse=True)
    result |= {"value": float(array.mean()), "rows": int(row_labels.size), "columns": int(column_labels.size)}
    rng = np.random.default_rng(seed)
    row_draws = rng.multinomial(row_labels.size, np.full(row_labels.size, 1 / row_labels.size), size=resamples)
    column_draws = rng.multinomial(column_labels.size, np.full(column_labels.size, 1 / column_labels.size),
                                   size=resamples)
    weights = row_draws[:, row_index] * column_draws[:, column_index]
    totals = weights.sum(axis=1)
    kept = totals > 0
    means = (weights[kept] @ array) / totals[kept]
    result["empty_resamples"] = int((~kept).sum())
    tail = (1 - confidence) / 2
    result["ci_low"], result["ci_high"] = (float(q) for q in np.quantile(means, [tail, 1 - tail]))
    return result
