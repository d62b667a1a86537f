"""From scores.parquet to the evaluation's numbers: each system's score per metric, and MASCOT against
each other system, on each evaluation set.

A conversation's score on a judged metric is the mean of its judges' scores, each standardised within its
judge (`panel_scores`), and only where the whole panel scored it: an incomplete panel is left out and
counted per system (their agreement is reported beside). Every summary resamples clusters (`mascot.evaluation.statistics`):
per system, mean ± sd over conversations, n conversations, contexts, clusters and seeds, and an
interval; per comparison, the baseline it is against, the paired difference over the (context, seed)
pairs both systems have a value for (a conversation without its partner is left out and counted),
its interval (over the training seeds too, where a system was played once per training run:
`statistics.paired_comparison_over_runs`), a sign-flip permutation p, and Holm's adjustment across every comparison of the report
(each evaluation set, level, metric, baseline and split: one family). No difference is reported
without its baseline.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from mascot.evaluation.conversations import with_training_seed
from mascot.evaluation.scoring import AUTOMATIC
from mascot.evaluation.statistics import (
    POWER,
    holm,
    judge_agreement,
    minimum_detectable_effect,
    paired_comparison_over_runs,
    per_context_means,
    summarise,
)

REFERENCE = "mascot"
COLLECTIVE = "collective"  # the level whose rubric only groups can score fairly
SPLITS = ("valence", "meeting_type")  # Empathetic Dialogues by valence, QMSum by meeting domain
MIN_SPLIT_CONTEXTS = 2  # a bucket of one context has no spread and no interval over contexts


def panel_scores(scores: pl.DataFrame) -> pl.DataFrame:
    """One row per conversation and metric: the panel's score, from each judge's score standardised within that judge
    (z over the conversations of the evaluation that the whole panel scored, at that level and metric), averaged over the judges and
    put back on the scale by the pooled mean and sd of all the panel's scores; so a harsh or a lenient judge moves
    every conversation alike, and one judge's spread does not outweigh another's. With one judge the value is its
    own. `complete` is false where a judge of the panel (every judge that scored that level anywhere) has no score
    for the conversation or scored fewer of its items (turns) than it had: such a panel is incomplete, and is left
    out of every summary and comparison (`complete_panels`) rather than averaged over the judges left. Automatic
    metrics are as they are. Null where the metric is undefined for the conversation."""
    scores = with_training_seed(scores)
    keys = ["system", "context_id", "seed", "training_seed", "level", "metric"]
    judged = scores.filter(pl.col("level") != AUTOMATIC)
    if "items" not in judged.columns:
        judged = judged.with_columns(items=pl.lit(None, pl.Int64))
    conversation = ["system", "context_id", "seed", "training_seed", "level"]
    judged = judged.with_columns(complete=(
        (pl.col("judge").n_unique().over(*conversation) == pl.col("judge").n_unique().over("level"))
        & (pl.col("items").is_null() | pl.col("n").is_null() | (pl.col("n") >= pl.col("items"))).all()
        .over(*conversation)))
    # Each judge is standardised on the conversations the whole panel scored, as Stage 1's zscore aggregation is,
    # so that every judge's mean and sd are taken over the same set.
    on_complete = pl.col("value").filter(pl.col("complete"))
    standardised = judged.with_columns(
        judge_mean=on_complete.mean().over("level", "metric", "judge"),
        judge_sd=on_complete.std().over("level", "metric", "judge"),
        pooled_mean=on_complete.mean().over("level", "metric"),
        pooled_sd=on_complete.std().over("level", "metric"),
    ).with_columns(z=pl.when(pl.col("judge_sd") > 0)
                   .then((pl.col("value") - pl.col("judge_mean")) / pl.col("judge_sd")).otherwise(0.0))
    panel = (standardised.group_by(*keys, maintain_order=True).agg(
        (pl.col("pooled_mean").first() + pl.col("pooled_sd").fill_null(0.0).first() * pl.col("z").mean())
        .alias("value"),
        pl.col("judge").n_unique().alias("judges"),
        pl.col("complete").first()))
    automatic = (scores.filter(pl.col("level") == AUTOMATIC).group_by(*keys, maintain_order=True)
                 .agg(pl.col("value").mean(), pl.col("judge").n_unique().alias("judges"), pl.lit(True).alias("complete")))
    return pl.concat([panel.with_columns(pl.col("value").cast(pl.Float64), pl.col("judges").cast(pl.UInt32)),
                      automatic.with_columns(pl.col("value").cast(pl.Float64), pl.col("judges").cast(pl.UInt32))])


def complete_panels(scores: pl.DataFrame) -> pl.DataFrame:
    """The panel scores of conversations whose panel is complete; the others are counted by `incomplete_panels`."""
    return panel_scores(scores).filter(pl.col("complete")).drop("complete")


def incomplete_panels(scores: pl.DataFrame, systems: list[str]) -> dict[str, dict[str, dict[str, int]]]:
    """Per judged level and system: the conversations scored, and those whose panel was incomplete (a judge failed on
    the conversation, or on one of its turns), which every summary and comparison leaves out."""
    panels = panel_scores(scores).filter(pl.col("level") != AUTOMATIC)
    counts: dict[str, dict[str, dict[str, int]]] = {}
    per_conversation = panels.group_by("system", "context_id", "seed", "training_seed", "level").agg(
        pl.col("complete").all())
    for level in ("persona", "collective"):
        for system in systems:
            rows = per_conversation.filter((pl.col("level") == level) & (pl.col("system") == system))
            if not rows.is_empty():
                counts.setdefault(level, {})[system] = {"conversations": rows.height,
                                                        "incomplete": int((~rows["complete"]).sum())}
    return counts


def evaluation_results(scores: pl.DataFrame, contexts: pl.DataFrame, systems: list[str], confidence: float = 0.95,
                       resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Every system's summaries and MASCOT's comparisons, for each evaluation set and for all of them."""
    merged = complete_panels(scores).join(with_cluster(contexts).select("context_id", "eval_set", "cluster"),
                                       on="context_id", how="left")
    sets = {"all": merged, **{name: rows for (name,), rows in merged.group_by("eval_set", maintain_order=True)}}
    return {name: _set_results(rows, systems, confidence, resamples, seed) for name, rows in sets.items()}


def split_results(scores: pl.DataFrame, contexts: pl.DataFrame, systems: list[str], confidence: float = 0.95,
                  resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The same results within each evaluation set by valence and by meeting domain, where a set has at
    least two values of the column: `{set: {column: {value: results}}}`. A value with fewer than
    MIN_SPLIT_CONTEXTS contexts is listed with its count and no results (`None`)."""
    merged = complete_panels(scores).join(with_cluster(contexts).select("context_id", "eval_set", "cluster", *SPLITS),
                                       on="context_id", how="left")
    splits: dict[str, Any] = {}
    for (name,), rows in merged.group_by("eval_set", maintain_order=True):
        for column in SPLITS:
            values = sorted(rows[column].drop_nulls().unique().to_list())
            if len(values) < 2:
                continue
            buckets = {}
            for value in values:
                bucket = rows.filter(pl.col(column) == value)
                count, units = bucket["context_id"].n_unique(), bucket["cluster"].n_unique()
                buckets[value] = {"contexts": count, "clusters": units,
                                  "results": _set_results(bucket, systems, confidence, resamples, seed)
                                  if units >= MIN_SPLIT_CONTEXTS else None}
            splits.setdefault(name, {})[column] = buckets
    return splits


def with_cluster(contexts: pl.DataFrame) -> pl.DataFrame:
    """eval/contexts.parquet with its `cluster` column (each context its own where an older file has none)."""
    return contexts if "cluster" in contexts.columns else contexts.with_columns(cluster=pl.col("context_id"))


def _set_results(rows: pl.DataFrame, systems: list[str], confidence: float, resamples: int, seed: int) -> dict:
    """Summaries and comparisons whose unit of independence is the cluster (a meeting; else the context): intervals
    resample clusters, and comparisons pair two systems cluster by cluster."""
    from mascot.evaluation.systems import SYSTEMS

    summaries, comparisons = [], []
    for (level, metric), metric_rows in rows.group_by("level", "metric", maintain_order=True):
        per_system = {}
        # The collective rubric scores a single voice low by construction ("one voice dominates"), so its scores
        # and differences are reported among group systems only; a single assistant meets MASCOT on the persona
        # level, the automatic metrics and the neutral pairwise rubric.
        for system in [s for s in systems if level != COLLECTIVE or SYSTEMS[s].group]:
            own = metric_rows.filter(pl.col("system") == system)
            if own.is_empty():
                continue
            values, contexts, clusters = own["value"].to_list(), own["context_id"].to_list(), own["cluster"].to_list()
            summaries.append({"level": level, "metric": metric, "system": system,
                              **summarise(values, contexts, own["seed"].to_list(), confidence, resamples, seed,
                                          clusters=clusters, runs=own["training_seed"].to_list())})
            per_system[system] = per_context_means(values, clusters)
        for baseline in systems:
            if baseline != REFERENCE and REFERENCE in per_system and baseline in per_system:
                comparisons.append({"level": level, "metric": metric, "system": REFERENCE, "baseline": baseline,
                                    **paired_rows(metric_rows, baseline, confidence, resamples, seed)})
    return {"summaries": summaries, "comparisons": comparisons}


def paired_rows(metric_rows: pl.DataFrame, baseline: str, confidence: float, resamples: int, seed: int) -> dict:
    """MASCOT against `baseline` on the (context, seed) pairs where both have a value (a failed or undefined
    conversation on either side drops its pair, counted as `unpaired`), averaged per cluster and training run and
    compared (`paired_comparison_over_runs`). A baseline played once per training run (an ablation of the same trained
    parts) meets MASCOT run by run; one played once meets each of MASCOT's runs."""
    from mascot.config.evaluation import SEEDED_SYSTEMS

    keys = ["context_id", "seed", "cluster"] + (["training_seed"] if baseline in SEEDED_SYSTEMS else [])
    sides = [metric_rows.filter((pl.col("system") == name) & pl.col("value").is_not_null())
             .select("context_id", "seed", "cluster", "training_seed", "value") for name in (REFERENCE, baseline)]
    if "training_seed" not in keys:
        sides[1] = sides[1].drop("training_seed")
    paired = sides[0].join(sides[1], on=keys, suffix="_baseline")
    cells = list(zip(paired["cluster"].to_list(), paired["training_seed"].to_list(), strict=True))
    result = paired_comparison_over_runs(per_context_means(paired["value"].to_list(), cells),
                                         per_context_means(paired["value_baseline"].to_list(), cells),
                                         confidence, resamples, seed)
    unpaired = sides[0].join(sides[1], on=keys, how="anti").height + sides[1].join(sides[0], on=keys, how="anti").height
    return result | {"clusters": result["contexts"], "contexts": paired["context_id"].n_unique(),
                     "seeds": paired["seed"].n_unique(), "training_seeds": paired["training_seed"].n_unique(),
                     "pairs": paired.height, "unpaired": unpaired}


def adjust_across_report(results: dict[str, Any], splits: dict[str, Any], primary: dict[str, Any] | None = None,
                         confidence: float = 0.95) -> int:
    """Holm across every comparison the report makes, in every evaluation set, level, metric, baseline and split
    bucket: one family, so that no difference is called significant because many were looked at. The declared
    primary endpoint (`primary_comparison`), where there is one, is tested alone at its own p and kept out of the
    family; every other comparison is secondary. Returns the family's size."""
    family = [c for r in results.values() for c in r["comparisons"]]
    family += [c for columns in splits.values() for buckets in columns.values() for bucket in buckets.values()
               if bucket["results"] for c in bucket["results"]["comparisons"]]
    chosen = primary_comparison(results, primary)
    if chosen is not None:
        chosen |= {"role": "primary", "p_holm": chosen["p"], "holm_family": "the primary endpoint, tested alone"}
        family = [c for c in family if c is not chosen]
    for comparison, adjusted in zip(family, holm([c["p"] for c in family]), strict=True):
        comparison["p_holm"] = adjusted
        comparison["role"] = "secondary" if chosen is not None else "one family"
        comparison["holm_family"] = (f"every secondary comparison of the report ({len(family)})" if chosen is not None
                                     else f"every comparison of the report ({len(family)})")
    alpha = 1 - confidence
    if chosen is not None:
        add_detectable_effect(chosen, alpha, "the primary endpoint's own level")
    for comparison in family:  # the level Holm's first step asks of the smallest p: alpha over the family's size
        add_detectable_effect(comparison, alpha / len(family), f"Holm's first step, alpha / {len(family)}")
    return len(family)


def add_detectable_effect(comparison: dict[str, Any], alpha: float, why: str) -> None:
    """The comparison's minimum detectable effect at POWER, from its observed sd of per-cluster differences and its
    clusters, at the two-sided level `alpha` its test must clear."""
    comparison["mde"] = minimum_detectable_effect(comparison.get("sd"), comparison.get("clusters", 0), alpha)
    comparison["mde_alpha"], comparison["mde_power"], comparison["mde_level"] = alpha, POWER, why


def primary_comparison(results: dict[str, Any], primary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The comparison the config declared primary (eval.primary: baseline, level, metric, eval_set), or None where
    none was declared or the evaluation did not make it (its set or baseline was not played)."""
    if not primary or primary.get("baseline") is None:
        return None
    compared = results.get(primary["eval_set"], {}).get("comparisons", [])
    return next((c for c in compared if (c["baseline"], c["level"], c["metric"]) ==
                 (primary["baseline"], primary["level"], primary["metric"])), None)


AGREEMENT_RESAMPLES = 500  # alpha is recomputed per resample; its interval needs fewer than a mean's


def judge_agreements(scores: pl.DataFrame, contexts: pl.DataFrame | None = None, confidence: float = 0.95,
                     seed: int = 0, judgments: pl.DataFrame | None = None) -> dict[str, Any]:
    """Krippendorff's alpha between the judges of each panel on the unit each judge rated, within each system: pooled
    across systems, the differences between systems would count as agreement. The persona-level judges rate each
    companion turn, so their alpha is on the turns' overall scores (from `judgments`, eval/judgments.parquet; without
    it, on the conversations' means over turns, which hides their disagreement turn by turn); the collective judges
    rate a conversation. Each alpha has a percentile bootstrap interval that resamples clusters with their rated
    units (`AGREEMENT_RESAMPLES` times)."""
    cluster_of = ({} if contexts is None else
                  dict(with_cluster(contexts).select("context_id", "cluster").iter_rows()))
    result = {}
    for level in ("persona", "collective"):
        rated = rated_units(scores, judgments, level)
        systems = {}
        for system in rated["system"].unique(maintain_order=True).to_list():
            own = rated.filter(pl.col("system") == system)
            by_judge: dict[str, dict[str, float]] = {}
            for record in own.iter_rows(named=True):
                by_judge.setdefault(record["judge"], {})[record["item"]] = record["value"]
            clusters = {item: cluster_of.get(context, context)
                        for item, context in own.select("item", "context_id").unique().iter_rows()}
            systems[system] = alpha_with_interval(by_judge, clusters, confidence, seed)
        unit = "turn" if level == "persona" and judgments is not None and "level" in judgments.columns \
            else "conversation"
        result[level] = {"judges": rated["judge"].n_unique(), "level": "interval", "within": "system", "unit": unit,
                         "systems": systems}
    return result


def rated_units(scores: pl.DataFrame, judgments: pl.DataFrame | None, level: str) -> pl.DataFrame:
    """Each judge's overall score of each unit it rated at `level`: system, context_id, item, judge, value. A turn
    (from eval/judgments.parquet, where given, at the persona level), else a conversation (from scores.parquet)."""
    if level == "persona" and judgments is not None and "level" in judgments.columns:
        turns = judgments.filter((pl.col("level") == level) & pl.col("ok")).drop_nulls("overall")
        parts = pl.col("query_id").str.split("|")
        return turns.select(system=parts.list.get(0), context_id=parts.list.get(1), item=pl.col("query_id"),
                            judge=pl.col("judge"), value=pl.col("overall").cast(pl.Float64))
    rows = with_training_seed(scores).filter((pl.col("level") == level) & (pl.col("metric") == "overall")) \
        .drop_nulls("value")
    run = pl.when(pl.col("training_seed") > 0).then(pl.format("|r{}", pl.col("training_seed"))).otherwise(pl.lit(""))
    return rows.select("system", "context_id",
                       item=pl.concat_str(pl.col("context_id"), pl.lit("|"), pl.col("seed").cast(pl.String), run),
                       judge=pl.col("judge"), value=pl.col("value"))


def alpha_with_interval(by_judge: dict[str, dict[str, float]], cluster_of: dict[str, str], confidence: float,
                        seed: int) -> dict[str, Any]:
    """judge_agreement's alpha on one system's rated units, with an interval that resamples the units' clusters
    (`cluster_of[unit]`; a unit not named is its own cluster) with all their units; resamples where alpha is
    undefined (one judge left, no spread) are skipped."""
    import numpy as np

    point = judge_agreement(by_judge)
    result = {**point, "ci_low": None, "ci_high": None, "confidence": confidence, "resamples": 0}
    if point["alpha"] is None:
        return result
    items = sorted({item for scored in by_judge.values() for item in scored})
    groups: dict[str, list[str]] = {}
    for item in items:
        groups.setdefault(cluster_of.get(item, item), []).append(item)
    clusters = sorted(groups)
    rng = np.random.default_rng(seed)
    alphas = []
    for _ in range(AGREEMENT_RESAMPLES):
        drawn = rng.integers(0, len(clusters), size=len(clusters))
        picked = [(f"{k}#{item}", item) for k, index in enumerate(drawn) for item in groups[clusters[index]]]
        resampled = {judge: {name: scored[item] for name, item in picked if item in scored}
                     for judge, scored in by_judge.items()}
        alpha = judge_agreement(resampled)["alpha"]
        if alpha is not None and np.isfinite(alpha):
            alphas.append(alpha)
    if alphas:
        tail = (1 - confidence) / 2
        result["ci_low"], result["ci_high"] = (float(q) for q in np.quantile(alphas, [tail, 1 - tail]))
        result["resamples"] = len(alphas)
    return result


def metric_names(scores: pl.DataFrame) -> dict[str, list[str]]:
    """The metrics of each level, in the order they were scored."""
    names: dict[str, list[str]] = {}
    for level, metric in scores.select("level", "metric").unique(maintain_order=True).iter_rows():
        names.setdefault(level, []).append(metric)
    return {level: names.get(level, []) for level in ("persona", "collective", AUTOMATIC)}


def reasoning_counts(conversations: pl.DataFrame) -> dict[str, int]:
    """CoT turns, and those whose reply had no marker after every attempt (failures, kept whole and flagged), in all
    and per system."""
    turns = conversations.filter((pl.col("role") == "companion") & pl.col("reasoning_marked").is_not_null())
    by_system = {system: {"turns": rows.height, "failed": int((~rows["reasoning_marked"]).sum())}
                 for (system,), rows in turns.group_by("system", maintain_order=True)} if "system" in turns.columns else {}
    return {"turns": turns.height, "unmarked": int((~turns["reasoning_marked"]).sum()), "by_system": by_system}


def independence(contexts: pl.DataFrame) -> dict[str, Any]:
    """Per evaluation set: its contexts, its clusters (units of independence), and how many of its contexts share a
    cluster with a training context, as eval/contexts.parquet counted them (None where the file predates the
    count, so nothing may be claimed)."""
    counted = "training_contexts_in_cluster" in contexts.columns
    result = {}
    for (name,), rows in with_cluster(contexts).group_by("eval_set", maintain_order=True):
        result[name] = {"contexts": rows.height, "clusters": rows["cluster"].n_unique(),
                        "sharing_training_cluster": int((rows["training_contexts_in_cluster"] > 0).sum())
                        if counted else None}
    return result


def build_summary(run: str, systems: list[str], seeds: list[int], judges: dict[str, Any], contexts: pl.DataFrame,
                  scores: pl.DataFrame, conversations: pl.DataFrame,
                  confidence: float = 0.95, resamples: int = 2000, seed: int = 0,
                  primary: dict[str, Any] | None = None, judgments: pl.DataFrame | None = None,
                  training_seeds: int = 1) -> dict[str, Any]:
    """Everything report.md and summary.json show."""
    from mascot.evaluation.systems import REPLY_MARKER, SYSTEMS

    results = evaluation_results(scores, contexts, systems, confidence, resamples, seed)
    splits = split_results(scores, contexts, systems, confidence, resamples, seed)
    return {"run": run, "systems": systems, "descriptions": {name: SYSTEMS[name].description for name in systems}, "seeds": seeds,
            "training_seeds": training_seeds, "judges": judges,
            "contexts": dict(contexts.group_by("eval_set", maintain_order=True).len().iter_rows()),
            "independence": independence(contexts),
            "confidence": confidence, "metrics": metric_names(scores),
            "reasoning": {"marker": REPLY_MARKER, **reasoning_counts(conversations)},
            "results": results, "splits": splits, "holm_family": adjust_across_report(results, splits, primary, confidence),
            "incomplete_panels": incomplete_panels(scores, systems),
            "primary": {"declared": primary, "comparison": primary_comparison(results, primary)},
            "agreement": judge_agreements(scores, contexts, confidence, seed, judgments)}
