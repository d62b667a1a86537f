"""The statistics of the evaluation: every number with its n, seeds, spread and interval.

The unit of independence is the held-out context: one context's conversations (its seeds, its
turns) share a history, so every interval resamples contexts, never replies or pairs. A system's
score is first averaged within each context; comparisons pair two systems context by context.
The paired test is a sign-flip permutation test of the mean of those differences (the quantity the
interval is on; no assumption that judge scores are normal), and the p-values of every comparison a
report makes are Holm-corrected together (`results.build_summary`).

A system built from the trained Speaker or Director is played once per training run (`eval.training_seeds`). A
run's luck is shared by every context it plays, so runs are crossed with contexts, not nested in them: with more than
one run, each bootstrap resample draws the clusters and, once for all of them, the runs, both with replacement
(a two-level bootstrap), and the interval holds training variance. With one run, every figure is computed exactly as
without runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from mascot.stats import clustered_mean, crossed_clustered_mean

OVER_CLUSTERS = "percentile bootstrap over clusters"
OVER_RUNS = "percentile bootstrap over clusters and training seeds (each resample draws both, with replacement)"
# A bootstrap over one cluster draws that cluster every time: its "interval" has no width and would read as certainty
# (a tiny meetings profile holds out one meeting). Below this many clusters a figure has no interval.
MIN_CLUSTERS = 2


def no_interval_below_min_clusters(result: dict, clusters: int) -> dict:
    """`result` without its interval (`ci_low`, `ci_high` None) where it came from fewer than `MIN_CLUSTERS`."""
    return result | {"ci_low": None, "ci_high": None} if clusters < MIN_CLUSTERS else result


def per_context_means(values: Sequence[float | None], contexts: Sequence[str]) -> dict[str, float]:
    """The mean of each context's values, skipping None (a metric undefined for that item)."""
    grouped: dict[str, list[float]] = defaultdict(list)
    for value, context in zip(values, contexts, strict=True):
        if value is not None:
            grouped[context].append(float(value))
    return {context: float(np.mean(items)) for context, items in grouped.items()}


def summarise(values: Sequence[float | None], contexts: Sequence[str], seeds: Sequence[int],
              confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
              clusters: Sequence[str] | None = None, runs: Sequence[int] | None = None) -> dict:
    """One system's metric: mean ± sd over items, n items, contexts, clusters, seeds and training runs, and a
    bootstrap interval of the mean that resamples clusters (each item's unit of independence, a meeting say; by
    default its context) and, where the items come from more than one training run (`runs`), the runs too, crossed
    with the clusters (`crossed_clustered_mean`). Items with no value (None) are counted apart."""
    clusters = contexts if clusters is None else clusters
    runs = [0] * len(values) if runs is None else runs
    kept = [(float(v), c, s, u, r) for v, c, s, u, r in zip(values, contexts, seeds, clusters, runs, strict=True)
            if v is not None]
    items, units, trained = [k[0] for k in kept], [k[3] for k in kept], [k[4] for k in kept]
    if len(set(trained)) > 1:
        result = crossed_clustered_mean(items, units, [str(r) for r in trained], confidence, resamples, seed)
        result["clusters"], interval = result["rows"], OVER_RUNS
    else:
        result, interval = clustered_mean(items, units, confidence, resamples, seed), OVER_CLUSTERS
    result = no_interval_below_min_clusters(result, result["clusters"])
    array = np.asarray(items)
    return {"mean": result["value"], "sd": float(array.std(ddof=1)) if array.size > 1 else None,
            "n": result["n"], "contexts": len({k[1] for k in kept}), "clusters": result["clusters"],
            "seeds": len({k[2] for k in kept}), "training_seeds": len(set(trained)), "undefined": len(values) - len(kept),
            "ci_low": result["ci_low"], "ci_high": result["ci_high"], "confidence": confidence,
            "interval": interval}


def paired_comparison(system: dict[str, float], baseline: dict[str, float], confidence: float = 0.95,
                      resamples: int = 2000, seed: int = 0) -> dict:
    """system - baseline over the units both have (per-unit means, a unit being a cluster of contexts: a
    meeting, or a context): the mean difference, its sd, a percentile bootstrap interval over units and
    a paired sign-flip permutation p (`sign_flip_test`). `contexts` counts the units (the caller names them)."""
    shared = sorted(system.keys() & baseline.keys())
    differences = [system[c] - baseline[c] for c in shared]
    interval = no_interval_below_min_clusters(clustered_mean(differences, shared, confidence, resamples, seed),
                                               len(shared))
    result = {"mean": interval["value"], "sd": float(np.std(differences, ddof=1)) if len(shared) > 1 else None,
              "contexts": len(shared), "ci_low": interval["ci_low"], "ci_high": interval["ci_high"],
              "confidence": confidence, "interval": OVER_CLUSTERS}
    return result | sign_flip_test(differences, seed=seed)


def paired_comparison_over_runs(system: dict[tuple[str, int], float], baseline: dict[tuple[str, int], float],
                                confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> dict:
    """system - baseline over the (unit, training run) cells both have, a unit being a cluster of contexts: each
    unit's difference is the mean of its runs' differences (a system played once, untrained, is the same in every
    run's cell), and the mean, sd and sign-flip p are those of `paired_comparison` over these per-unit differences,
    so with one run this is `paired_comparison` exactly. With more, the interval is a two-level bootstrap: each
    resample draws the units and, once for all of them (a run's luck is shared by every context it plays), the runs,
    both with replacement; a unit's difference is then the mean over the drawn runs, counted as often as drawn, and
    a unit none of whose drawn runs it has is left out of that resample. The p-value takes the runs as they are (the
    runs are too few to permute), so only the interval holds training variance, and the result says so."""
    shared = sorted(system.keys() & baseline.keys())
    run_ids = sorted({run for _, run in shared})
    units = sorted({unit for unit, _ in shared})
    if len(run_ids) <= 1:
        result = paired_comparison({unit: system[(unit, run)] for unit, run in shared},
                                   {unit: baseline[(unit, run)] for unit, run in shared}, confidence, resamples, seed)
        return result | {"training_seeds": len(run_ids), "p_conditional_on_runs": False}
    cells = np.full((len(units), len(run_ids)), np.nan)
    for unit, run in shared:
        cells[units.index(unit), run_ids.index(run)] = system[(unit, run)] - baseline[(unit, run)]
    per_unit = np.nanmean(cells, axis=1)
    result = paired_comparison(dict(zip(units, per_unit, strict=True)), dict.fromkeys(units, 0.0), confidence,
                               resamples, seed)
    rng = np.random.default_rng(seed)
    unit_draws = rng.multinomial(len(units), np.full(len(units), 1 / len(units)), size=resamples)
    run_draws = rng.multinomial(len(run_ids), np.full(len(run_ids), 1 / len(run_ids)), size=resamples)
    present, values = ~np.isnan(cells), np.nan_to_num(cells)
    weight = run_draws @ present.T  # resample x unit: the drawn runs each unit has
    with np.errstate(invalid="ignore", divide="ignore"):
        unit_means = (run_draws @ values.T) / weight
    counted = unit_draws * (weight > 0)
    kept = counted.sum(axis=1) > 0
    means = (np.nan_to_num(unit_means) * counted)[kept].sum(axis=1) / counted[kept].sum(axis=1)
    tail = (1 - confidence) / 2
    low, high = (float(q) for q in np.quantile(means, [tail, 1 - tail]))
    interval = no_interval_below_min_clusters({"ci_low": low, "ci_high": high}, len(units))
    return result | interval | {"interval": OVER_RUNS, "training_seeds": len(run_ids), "p_conditional_on_runs": True}


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
        interval = no_interval_below_min_clusters(interval, interval["clusters"])
        return {**counts, "contexts": interval["clusters"], "win_rate": interval["value"],
                "ci_low": interval["ci_low"], "ci_high": interval["ci_high"],
                "interval": "percentile bootstrap over contexts"}
    interval = crossed_clustered_mean(outcomes, contexts, raters, confidence, resamples, seed)
    interval = no_interval_below_min_clusters(interval, interval["rows"])
    return {**counts, "contexts": interval["rows"], "win_rate": interval["value"], "ci_low": interval["ci_low"],
            "ci_high": interval["ci_high"], "interval": "percentile bootstrap over contexts and raters, crossed"}
