"""The statistics of the evaluation: every number with its n, seeds, spread and interval.

The unit of independence is the held-out context: one context's conversations (its seeds, its
turns) share a history, so every interval resamples contexts, never replies or pairs. A system's
score is first averaged within each context; comparisons pair two systems context by context.
The paired test is a sign-flip permutation test of the mean of those differences (the quantity the
interval is on; no assumption that judge scores are normal), and the p-values of every comparison a
report makes are Holm-corrected together (`results.build_summary`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from mascot.stats import clustered_mean, crossed_clustered_mean


def per_context_means(values: Sequence[float | None], contexts: Sequence[str]) -> dict[str, float]:
    """The mean of each context's values, skipping None (a metric undefined for that item)."""
    grouped: dict[str, list[float]] = defaultdict(list)
    for value, context in zip(values, contexts, strict=True):
        if value is not None:
            grouped[context].append(float(value))
    return {context: float(np.mean(items)) for context, items in grouped.items()}


def summarise(values: Sequence[float | None], contexts: Sequence[str], seeds: Sequence[int],
              confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
              clusters: Sequence[str] | None = None) -> dict:
    """One system's metric: mean ± sd over items, n items, contexts, clusters and seeds, and a bootstrap
    interval of the mean that resamples clusters (each item's unit of independence, a meeting say; by
    default its context). Items with no value (None) are counted apart."""
    clusters = contexts if clusters is None else clusters
    kept = [(float(v), c, s, u) for v, c, s, u in zip(values, contexts, seeds, clusters, strict=True) if v is not None]
    result = clustered_mean([v for v, _, _, _ in kept], [u for _, _, _, u in kept], confidence, resamples, seed)
    array = np.asarray([v for v, _, _, _ in kept])
    return {"mean": result["value"], "sd": float(array.std(ddof=1)) if array.size > 1 else None,
            "n": result["n"], "contexts": len({c for _, c, _, _ in kept}), "clusters": result["clusters"],
            "seeds": len({s for _, _, s, _ in kept}), "undefined": len(values) - len(kept),
            "ci_low": result["ci_low"], "ci_high": result["ci_high"], "confidence": confidence,
            "interval": "percentile bootstrap over clusters"}


def paired_comparison(system: dict[str, float], baseline: dict[str, float], confidence: float = 0.95,
                      resamples: int = 2000, seed: int = 0) -> dict:
    """system - baseline over the units both have (per-unit means, a unit being a cluster of contexts: a
    meeting, or a context): the mean difference, its sd, a percentile bootstrap interval over units and
    a paired sign-flip permutation p (`sign_flip_test`). `contexts` counts the units (the caller names them)."""
    shared = sorted(system.keys() & baseline.keys())
    differences = [system[c] - baseline[c] for c in shared]
    interval = clustered_mean(differences, shared, confidence, resamples, seed)
    result = {"mean": interval["value"], "sd": float(np.std(differences, ddof=1)) if len(shared) > 1 else None,
              "contexts": len(shared), "ci_low": interval["ci_low"], "ci_high": interval["ci_high"],
              "confidence": confidence, "interval": "percentile bootstrap over clusters"}
    return result | sign_flip_test(differences, seed=seed)


EXACT_SIGN_FLIPS = 16  # up to 2^16 = 65,536 sign assignments are enumerated; beyond, a seeded sample of them


def sign_flip_test(differences: Sequence[float], resamples: int = 20000, seed: int = 0) -> dict:
    """Two-sided paired permutation test of a mean difference: under the null that each unit's two systems are
    exchangeable, each difference's sign is a coin flip, so p is the share of sign assignments whose mean is at
    least as far from 0 as the observed one. The test is on the mean, as the interval is (Wilcoxon's tests a
    pseudo-median, and its handling of zeros and ties depends on the SciPy version). Exact, enumerating all 2^n
    assignments, up to n = EXACT_SIGN_FLIPS; beyond, `resamples` random assignments with p = (k + 1) / (R + 1)."""
    array = np.asarray(differences, dtype=float)
    result = {"p": None, "test": "paired sign-flip permutation test of the mean difference", "permutations": 0,
              "exact": None}
    if array.size == 0:
        return result
    if array.size <= EXACT_SIGN_FLIPS:
        bits = (np.arange(2 ** array.size)[:, None] >> np.arange(array.size)) & 1
        signs, exact = 1 - 2 * bits, True
    else:
        signs, exact = np.random.default_rng(seed).choice([-1.0, 1.0], size=(resamples, array.size)), False
    observed = abs(array.mean())
    means = np.abs(signs @ array) / array.size
    extreme = int(np.count_nonzero(means >= observed - 1e-9 * max(1.0, observed)))
    p = extreme / len(signs) if exact else (extreme + 1) / (len(signs) + 1)
    kind = f"exact, all {len(signs)} sign assignments" if exact else f"Monte Carlo, {len(signs)} random sign assignments"
    return result | {"p": float(min(1.0, p)), "permutations": len(signs), "exact": exact,
                     "test": f"paired sign-flip permutation test of the mean difference ({kind})"}


POWER = 0.8


def minimum_detectable_effect(sd: float | None, n: int, alpha: float, power: float = POWER) -> float | None:
    """The smallest true mean difference a paired test of `n` units with differences of sd `sd` detects with
    probability `power` at two-sided level `alpha`: (t_{1-alpha/2} + t_{power}) * sd / sqrt(n), t with n - 1 degrees
    of freedom (the normal approximation's z made honest for few clusters). None below two units or without an sd."""
    if sd is None or n < 2:
        return None
    from scipy.stats import t

    return float((t.ppf(1 - alpha / 2, n - 1) + t.ppf(power, n - 1)) * sd / np.sqrt(n))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input's order (None stays None).

    The i-th smallest of m p-values is multiplied by m - i (from 0), and the adjusted values are
    made non-decreasing in that order, capped at 1."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(indexed):
        running = max(running, min(1.0, (len(indexed) - rank) * p))
        adjusted[index] = running
    return adjusted


def judge_agreement(scores: dict[str, dict[str, float]], level: str = "interval") -> dict:
    """Krippendorff's alpha between judges: `scores[judge][item]`; items a judge did not score are
    missing, not zero. None with fewer than two judges or two shared items. `level` is the level of
    measurement: "interval" for judge scores; "ordinal" for ordered choices such as human
    preferences (loss < tie < win); "nominal" for unordered categories."""
    judges = sorted(scores)
    items = sorted({item for by_item in scores.values() for item in by_item})
    result = {"alpha": None, "judges": len(judges), "items": len(items), "level": level,
              "method": "Krippendorff's alpha"}
    if len(judges) < 2 or len(items) < 2:
        return result
    import krippendorff

    matrix = np.array([[scores[j].get(item, np.nan) for item in items] for j in judges], dtype=float)
    if np.nanstd(matrix) == 0:
        return result  # every score the same: alpha is 0/0
    result["alpha"] = float(krippendorff.alpha(reliability_data=matrix, level_of_measurement=level))
    return result


def win_rate(outcomes: Sequence[float], contexts: Sequence[str], confidence: float = 0.95,
             resamples: int = 2000, seed: int = 0, raters: Sequence[str] | None = None) -> dict:
    """Wins (1), ties (0.5) and losses (0) of a system against a baseline: the counts, and the win
    rate (ties count half) with a bootstrap interval over contexts, or, given each outcome's rater,
    over contexts and raters crossed (`mascot.stats.crossed_clustered_mean`)."""
    counts = {"wins": sum(o == 1 for o in outcomes), "ties": sum(o == 0.5 for o in outcomes),
              "losses": sum(o == 0 for o in outcomes), "n": len(outcomes), "confidence": confidence}
    if raters is None:
        interval = clustered_mean(outcomes, contexts, confidence, resamples, seed)
        return {**counts, "contexts": interval["clusters"], "win_rate": interval["value"],
                "ci_low": interval["ci_low"], "ci_high": interval["ci_high"],
                "interval": "percentile bootstrap over contexts"}
    interval = crossed_clustered_mean(outcomes, contexts, raters, confidence, resamples, seed)
    return {**counts, "contexts": interval["rows"], "win_rate": interval["value"], "ci_low": interval["ci_low"],
            "ci_high": interval["ci_high"], "interval": "percentile bootstrap over contexts and raters, crossed"}
