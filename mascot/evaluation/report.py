"""What the evaluation reports: eval/summary.json and eval/report.md, and the same tables to wandb.

The report's first lines say who judged, with how many seeds, and what the numbers can and cannot
claim: whether a judge of the evaluation also labelled the training data, and that the heuristic
judges of the tiny profiles check the pipeline, not the recipe. Tables have the paper's shape
(systems as rows, criteria as columns); every cell is mean ± sd [interval], and every row says its
n, contexts and seeds. Differences appear only in the comparison tables, each against its named
baseline with its interval and its Holm-adjusted p.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from mascot.artifacts import Artifact, write_json, write_text
from mascot.evaluation.conversations import with_training_seed
from mascot.evaluation.pairwise import preference_results
from mascot.evaluation.plots import ablation_plot, system_dot_plot
from mascot.evaluation.results import MIN_SPLIT_CONTEXTS, build_summary, with_cluster
from mascot.evaluation.scoring import AUTOMATIC
from mascot.evaluation.systems import SYSTEMS
from mascot.tracking import log_metrics

HEADLINE = ("persona_consistency", "social_contribution")
LEVEL_TITLES = {"persona": "Persona level (0–100)", "collective": "Collective (0–100)",
                AUTOMATIC: "Automatic metrics"}


class ReportSpec(BaseModel):
    """What the report says besides the scores: the run, its systems and seeds, who judged, and how."""

    model_config = ConfigDict(frozen=True)

    run: str
    systems: list[str]
    seeds: list[int]
    judges: dict[str, Any]  # persona, collective, pairwise labels; shared_with_training; heuristic_only
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    collective_rubric: str | None = None  # its name: a single assistant weighed by it is flagged as tilted
    primary: dict[str, Any] | None = None  # eval.primary as resolved: baseline, level, metric, eval_set
    budgets: dict[str, dict[str, int]] = {}  # per system: SystemSetup.budget (turns, turn_tokens, block_tokens)
    training_seeds: int = 1  # eval.training_seeds: training runs of the Speaker's GRPO and the GRPO Director


def write_report(spec: ReportSpec, contexts: Artifact, scores: Artifact, conversations: Artifact,
                 preferences: Artifact, out: Path, judgments: Artifact | None = None,
                 ) -> tuple[dict[str, Any], dict[str, Artifact]]:
    summary = build_summary(spec.run, spec.systems, spec.seeds, spec.judges, contexts.read_parquet(),
                            scores.read_parquet(), conversations.read_parquet(), spec.confidence,
                            spec.resamples, spec.seed, spec.primary,
                            judgments.read_parquet() if judgments is not None else None, spec.training_seeds)
    clusters = dict(with_cluster(contexts.read_parquet()).select("context_id", "cluster").iter_rows())
    summary["preferences"] = preference_results(preferences.read_parquet(), spec.confidence, spec.resamples,
                                                spec.seed, clusters, spec.collective_rubric,
                                                companion_words(conversations.read_parquet()))
    summary["budgets"] = budget_summary(spec.budgets, conversations.read_parquet())
    figures = write_figures(summary, out)
    written = {"eval/summary": write_json(summary, out / "summary.json"), **figures,
               "eval/report": write_text(report_markdown(summary, [a.path.name for a in figures.values()]),
                                         out / "report.md")}
    tables = {f"{name}/{kind}": rows for name, results in summary["results"].items() for kind, rows in results.items()}
    tables |= {f"{name}/{column}={value}/{kind}": rows for name, columns in summary["splits"].items()
               for column, buckets in columns.items() for value, bucket in buckets.items() if bucket["results"]
               for kind, rows in bucket["results"].items()}
    log_metrics("eval", {name: rows for name, rows in {**tables, "preferences": summary["preferences"]}.items()
                         if rows})
    return summary, written


ABLATIONS = ("mascot", "mascot_p", "mascot_c")


def write_figures(summary: dict[str, Any], out: Path) -> dict[str, Artifact]:
    """On every evaluation context together: a dot plot per level (each criterion, each system, with its
    interval over contexts), and MASCOT beside its ablations on the headline criteria and overall."""
    results, systems = summary["results"]["all"], summary["systems"]
    labels = {name: SYSTEMS[name].label for name in systems}
    entries = {(e["system"], e["level"], e["metric"]): e for e in results["summaries"]}
    figures = {}
    for level in ("persona", "collective"):
        metrics = ordered_metrics(summary["metrics"][level])
        if metrics:
            figures[f"eval/figure_{level}"] = system_dot_plot(
                {(s, m): e for (s, lv, m), e in entries.items() if lv == level}, systems, labels, metrics,
                f"{LEVEL_TITLES[level]}: mean and {summary['confidence']:.0%} interval over contexts "
                f"({summary['run']}, all evaluation contexts)", out / f"figure_{level}.png")
    ablations = [name for name in ABLATIONS if name in systems]
    wanted = [*(("persona", m) for m in HEADLINE), ("persona", "overall"), ("collective", "overall")]
    metrics = [(level, m) for level, m in wanted if any((s, level, m) in entries for s in ablations)]
    if len(ablations) > 1 and metrics:
        title = ("MASCOT and its ablations: no persona prompt (-P), random speaking order (-C)\n"
                 f"mean and {summary['confidence']:.0%} interval over contexts ({summary['run']}, all contexts)")
        figures["eval/figure_ablation"] = ablation_plot(entries, ablations, labels, metrics, title,
                                                        out / "figure_ablation.png")
    return figures


def budget_summary(budgets: dict[str, dict[str, int]], conversations) -> dict[str, dict[str, Any]]:
    """Each system's token budget per block with the companion words it wrote per block on average (over every
    conversation's blocks), the length the judges saw."""
    from mascot.evaluation.metrics import words

    totals: dict[tuple, int] = {}
    for system, context, seed, run, block, role, text in with_training_seed(conversations).select(
            "system", "context_id", "seed", "training_seed", "block", "role", "text").iter_rows():
        if role == "companion":
            key = (system, context, seed, run, block)
            totals[key] = totals.get(key, 0) + len(words(text or ""))
    result = {}
    for system, budget in budgets.items():
        blocks = [count for key, count in totals.items() if key[0] == system]
        result[system] = {**budget, "words_per_block": sum(blocks) / len(blocks) if blocks else None}
    return result


def incomplete_line(incomplete: dict[str, dict[str, dict[str, int]]]) -> str:
    """How many conversations per level and system had a judge of the panel fail, and so were left out."""
    total = sum(e["incomplete"] for systems in incomplete.values() for e in systems.values())
    if total == 0:
        return "Incomplete panels: none; every judge of each panel scored every conversation it was given, and every turn."
    levels = "; ".join(f"{level}: " + ", ".join(f"{SYSTEMS[system].label} {e['incomplete']} of {e['conversations']}"
                                                for system, e in systems.items())
                       for level, systems in incomplete.items())
    return (f"**Incomplete panels: {total} conversation score(s)** had a judge of the panel fail on the conversation or "
            f"on one of its turns, and are left out of every summary and comparison at that level (a partner then "
            f"goes unpaired) rather than averaged over the judges left ({levels}).")


def budget_line(budgets: dict[str, dict[str, Any]]) -> str:
    """Whether every system had the same companion tokens per block, as the setups capped them."""
    per_block = sorted({b["block_tokens"] for b in budgets.values()})
    if len(per_block) == 1:
        return (f"Budgets are matched: every system may write {per_block[0]} companion tokens per block (eval.block_tokens), "
                "a group's turns an equal share each and a single assistant's one reply all of them, so a group is not "
                "judged on more text by construction; the Systems table gives each cap and the words written.")
    return (f"**Budgets are not matched: companion tokens per block range over {', '.join(map(str, per_block))}** "
            "(see the Systems table); LLM judges favour longer answers.")


def resampled(summary: dict[str, Any]) -> str:
    """What the intervals resample: the clusters, and the training seeds where the group was trained more than once."""
    return "clusters" if summary.get("training_seeds", 1) == 1 else "clusters and training seeds"


def training_line(summary: dict[str, Any]) -> str:
    """How many times the group was trained, and so whether the intervals hold training variance."""
    runs, seeds = summary.get("training_seeds", 1), len(summary["seeds"])
    if runs == 1:
        return (f"Training seeds: 1 (eval.training_seeds). The {seeds} seed(s) are evaluation sampling seeds over this "
                "run's one training of the Speaker and the Director, so every interval holds the variance of contexts, "
                "sampling and judging, not of training: another training run could move every number.")
    return (f"Training seeds: {runs} (eval.training_seeds). The Speaker's GRPO and the GRPO Director were trained "
            f"{runs} times from the same data and reward models, and MASCOT and its ablations were played once per "
            f"training seed, each over the {seeds} evaluation seed(s); the other systems, which use no trained part of "
            "the group, once. Their intervals resample the training seeds as well as the clusters (a two-level "
            "bootstrap), so they hold training variance; a comparison's p-value takes the training seeds as they "
            "are, and the reward models, trained once, add no variance of their own.")


def preamble(summary: dict[str, Any]) -> list[str]:
    judges, lines = summary["judges"], []
    lines.append(f"Judges: {', '.join(judges['persona'])} (persona level), {', '.join(judges['collective'])} "
                 f"(collective), {judges['pairwise']} (pairwise). Seeds: {len(summary['seeds'])} "
                 f"({', '.join(map(str, summary['seeds']))}). Contexts: "
                 + ", ".join(f"{n} {name}" for name, n in summary["contexts"].items()) + ".")
    lines.append(independence_line(summary.get("independence") or {}))
    lines.append(training_line(summary))
    shared = judges.get("shared_models") or [{"judge": label, "model": label, "roles": [], "training": []}
                                             for label in judges["shared_with_training"]]
    if shared:
        named = "; ".join(f"{e['judge']} (model {e['model']}" + (f", {' and '.join(e['roles'])}" if e["roles"] else "")
                          + (f"; in training as {', '.join(e['training'])}" if e["training"] else "") + ")"
                          for e in shared)
        lines.append(f"**These evaluation judges are models that also labelled the training data: {named}.** A "
                     "policy trained on a judge's preferences is scored by that judge here, so MASCOT's differences "
                     "can overstate what an independent judge would find.")
    if judges["heuristic_only"]:
        lines.append("**The judges are the offline heuristic judges, not LLMs: these numbers check that the pipeline "
                     "runs and measures, and are not research claims about MASCOT.**")
    lines.append("Judge scores are on 0–100 by the linear map 100 × (score − min) / (max − min) of the rubric's "
                 "scale (1 → 0, 3 → 50, 5 → 100 on 1–5). A conversation's score is the mean over its companion "
                 "turns (persona level) and over the panel's judges, each judge's scores standardised within that "
                 "judge over the conversations the whole panel scored (so a harsh judge moves every conversation alike) and put back on the "
                 "scale by the pooled mean and sd. Cells are mean ± sd over conversations "
                 f"[{summary['confidence']:.0%} percentile bootstrap interval over {resampled(summary)}; a cluster is "
                 "the unit of independence: a meeting for QMSum, whose windows share participants and queries, "
                 "otherwise the context]; comparisons pair the systems cluster by cluster.")
    if summary.get("incomplete_panels") is not None:
        lines.append(incomplete_line(summary["incomplete_panels"]))
    if summary.get("budgets"):
        lines.append(budget_line(summary["budgets"]))
    cot = summary["reasoning"]
    if cot["turns"]:
        lines.append(cot_line(cot, summary.get("budgets") or {}))
    return lines


def cot_line(cot: dict[str, Any], budgets: dict[str, dict[str, Any]]) -> str:
    """How a CoT system's reply was found, with its reasoning budget and attempts as played, and its failures."""
    planned = {b.get("reasoning_tokens") for name, b in budgets.items() if name.endswith("_cot")}
    attempts = {b.get("attempts") for name, b in budgets.items() if name.endswith("_cot")}
    budget = (f" Each CoT turn may reason in {planned.pop()} tokens of its own, beyond its reply's share of the block, "
              f"and is sampled up to {attempts.pop()} time(s), each with its own seed, until its reply has the marker."
              if len(planned) == 1 and len(attempts) == 1 and None not in planned else "")
    failed = sum(e["failed"] for e in cot.get("by_system", {}).values()) if cot.get("by_system") else cot["unmarked"]
    per_system = "; ".join(f"{SYSTEMS[s].label} {e['failed']} of {e['turns']}" for s, e in cot.get("by_system", {}).items())
    if failed:  # a turn without the marker is judged whole, so "never judged" would be false for it
        return (f"CoT systems: the reply is the text after the last `{cot['marker']}`, and the reasoning before it is "
                f"not judged, but in a turn without the marker.{budget} **{failed} of {cot['turns']} CoT turns had no "
                f"marker after every attempt** ({per_system}): these are the CoT systems' failures, each judged "
                "whole, reasoning included, and flagged in eval/conversations.parquet (`reasoning_marked`).")
    return (f"CoT systems: the reply is the text after the last `{cot['marker']}`; the reasoning before it is never "
            f"judged.{budget} All {cot['turns']} CoT turns had their marker.")


def independence_line(independence: dict[str, Any]) -> str:
    """What eval/contexts.parquet counted about the evaluation contexts and training, and nothing it did not."""
    sets = ", ".join(f"{name}: {counted(e['contexts'], 'context')} in {counted(e['clusters'], 'cluster')}"
                     for name, e in independence.items())
    counts = [e["sharing_training_cluster"] for e in independence.values()]
    if not independence or None in counts:
        return (f"Clusters ({sets or 'not recorded'}). Whether an evaluation context shares a meeting or conversation "
                "with a training context was not counted for this run (its eval/contexts.parquet predates the "
                "count), so no such claim is made.")
    shared = sum(counts)
    verdict = ("none shares a cluster (a meeting or a conversation) with any context a training step read"
               if shared == 0 else f"**{shared} share a cluster with contexts a training step read**")
    return f"Clusters ({sets}); counted in eval/contexts.parquet, {verdict}."


def _digits(entry: dict[str, Any]) -> int:
    """Judge scores (0–100) and lengths to one decimal; shares and sentiment to three."""
    return 1 if entry["level"] != AUTOMATIC or entry["metric"] == "mean_length" else 3


def counted(count: int, noun: str) -> str:
    """'1 cluster', '2 clusters': a count and its regular noun."""
    return f"{count} {noun}{'s' * (count != 1)}"


def bracket(entry: dict[str, Any], spec: str) -> str:
    """An entry's interval as `[low, high]` in the format `spec`, or why it has none (fewer clusters than
    `statistics.MIN_CLUSTERS`)."""
    if entry["ci_low"] is None:
        clusters = entry.get("clusters")
        return f"[no interval: {counted(clusters, 'cluster')}]" if clusters is not None else "[no interval]"
    return f"[{entry['ci_low']:{spec}}, {entry['ci_high']:{spec}}]"


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None or entry["mean"] is None:
        return "–"
    d = _digits(entry)
    sd = f" ± {entry['sd']:.{d}f}" if entry["sd"] is not None else ""
    undefined = f" ({entry['undefined']} undefined)" if entry.get("undefined") else ""
    return f"{entry['mean']:.{d}f}{sd} {bracket(entry, f'.{d}f')}{undefined}"


def _difference(entry: dict[str, Any]) -> str:
    if entry["mean"] is None:
        return "–"
    d = _digits(entry)
    p = f", p_holm {entry['p_holm']:.3f}" if entry.get("p_holm") is not None else ""
    return f"{entry['mean']:+.{d}f} {bracket(entry, f'+.{d}f')}{p}"


def _alpha(result: dict[str, Any], unit: str = "conversation") -> str:
    units = f"{result['items']} {unit}s"
    if result["alpha"] is None:
        return f"not computable ({units})"
    interval = ("" if result["ci_low"] is None else
                f" [{result['ci_low']:.3f}, {result['ci_high']:.3f}]")
    return f"{result['alpha']:.3f}{interval} ({units})"


def detectable_effects(results: dict[str, Any], level: str, metrics: list[str], systems: list[str]) -> list[str]:
    """Each comparison's minimum detectable effect at 80% power, at the level its test must clear, from its own n and
    observed sd: a difference smaller than it could not have been told from 0 with this many clusters."""
    entries = {(e["baseline"], e["metric"]): e for e in results["comparisons"] if e["level"] == level}
    if not any(e.get("mde") is not None for e in entries.values()):
        return []
    levels = sorted({e["mde_level"] + f" = {e['mde_alpha']:.2g}" for e in entries.values() if "mde_level" in e})
    lines = [(f"Minimum detectable effect (MDE) at {next(iter(entries.values()))['mde_power']:.0%} power: the smallest "
              "true difference each comparison would detect, (t₁₋α/₂ + t_power) × sd / √clusters from its own "
              f"clusters and observed sd of per-cluster differences, at the two-sided level its test must clear "
              f"({'; '.join(levels)})."), "",
             "| MDE against | clusters | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for baseline in systems:
        first = next((entries[(baseline, m)] for m in metrics if (baseline, m) in entries), None)
        if first is None:
            continue
        cells = []
        for metric in metrics:
            entry = entries.get((baseline, metric))
            mde = None if entry is None else entry.get("mde")
            cells.append("–" if mde is None else f"{mde:.{_digits(entry)}f}"
                         + (" (primary)" if entry.get("role") == "primary" else ""))
        lines.append(f"| {SYSTEMS[baseline].label} | {first['clusters']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def primary_note(summary: dict[str, Any], eval_set: str, level: str) -> list[str]:
    """Under the comparison table that holds the primary endpoint, which cell it is."""
    primary = summary.get("primary") or {}
    declared = primary.get("declared") or {}
    if primary.get("comparison") is None or (declared["eval_set"], declared["level"]) != (eval_set, level):
        return []
    return [(f"**Primary endpoint:** the {declared['metric']} cell of − {SYSTEMS[declared['baseline']].label} "
            "(see the first section); every other cell is secondary."), ""]


def family_words(summary: dict[str, Any]) -> str:
    """How this report's p-values are adjusted: the primary endpoint apart, where one was computed."""
    if (summary.get("primary") or {}).get("comparison") is not None:
        return (f"the primary endpoint alone (its p_holm is its own p, a family of one), every other comparison secondary and Holm-adjusted across "
                f"all {summary.get('holm_family', '?')} secondary comparisons of this report (every set, level, "
                "metric, baseline and split bucket: one family).")
    return (f"Holm-adjusted across all {summary.get('holm_family', '?')} comparisons of this report (every set, level, "
            "metric, baseline and split bucket: one family).")


def unpaired_note(results: dict[str, Any], level: str) -> str:
    """The conversations left out of this level's comparisons for want of a partner (a failed or undefined
    conversation on the other side), when there were any."""
    left = sum(c.get("unpaired", 0) for c in results["comparisons"] if c["level"] == level)
    return f" {left} conversation score(s) without a partner on the other side were left out." if left else ""


def ordered_metrics(metrics: list[str]) -> list[str]:
    """Headline criteria first, overall last."""
    head = [m for m in HEADLINE if m in metrics]
    tail = [m for m in metrics if m not in head and m != "overall"]
    return [*head, *tail, *(["overall"] if "overall" in metrics else [])]


def system_table(results: dict[str, Any], level: str, metrics: list[str], systems: list[str]) -> list[str]:
    entries = {(e["system"], e["metric"]): e for e in results["summaries"] if e["level"] == level}
    lines = ["| system | n (contexts, seeds) | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for system in systems:
        first = next((entries[(system, m)] for m in metrics if (system, m) in entries), None)
        if first is None:
            continue
        lines.append(f"| {SYSTEMS[system].label} | {first['n']} ({first['contexts']}, {first['seeds']}) | "
                     + " | ".join(_cell(entries.get((system, m))) for m in metrics) + " |")
    return lines


def comparison_table(results: dict[str, Any], level: str, metrics: list[str], systems: list[str]) -> list[str]:
    entries = {(e["baseline"], e["metric"]): e for e in results["comparisons"] if e["level"] == level}
    lines = ["| MASCOT − baseline | contexts, seeds | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for baseline in systems:
        first = next((entries[(baseline, m)] for m in metrics if (baseline, m) in entries), None)
        if first is None:
            continue
        lines.append(f"| − {SYSTEMS[baseline].label} | {first['contexts']}, {first['seeds']} | "
                     + " | ".join(_difference(entries[(baseline, m)]) if (baseline, m) in entries else "–"
                                  for m in metrics) + " |")
    return lines


def primary_markdown(summary: dict[str, Any]) -> list[str]:
    """The pre-declared primary endpoint, first: what was declared, and its difference, interval, n and p."""
    primary = summary.get("primary") or {}
    declared, entry = primary.get("declared"), primary.get("comparison")
    if not declared or declared.get("baseline") is None:
        return []
    level = LEVEL_TITLES[declared["level"]].split(" (")[0].lower()
    what = (f"MASCOT − {SYSTEMS[declared['baseline']].label} on {declared['metric']} ({level}), contexts "
            f"{declared['eval_set']}")
    lines = ["## Primary endpoint", "", f"Declared in the config before the run (eval.primary): {what}."]
    if entry is None or entry["mean"] is None:
        lines += ["", ("**Not computed: the evaluation made no such comparison (its set, level, metric or baseline has "
                  "no paired conversations).** Every comparison below is secondary."), ""]
        return lines
    lines += ["", (f"- **Primary:** {_difference(entry).split(', p_holm')[0]}, {counted(entry['clusters'], 'cluster')} "
              f"({counted(entry['contexts'], 'context')}, {entry['seeds']} seed(s), {counted(entry['pairs'], 'pair')}), sd "
              f"{'–' if entry['sd'] is None else format(entry['sd'], '.3g')}; p = {entry['p']:.3f} ({entry['test']}), "
              "tested alone, unadjusted" + (f"; minimum detectable effect at {entry['mde_power']:.0%} power "
                                             f"{entry['mde']:.3g} (two-sided α {entry['mde_alpha']:.2g})"
                                             if entry.get("mde") is not None else "") + "."),
              "", (f"Every other comparison in this report is secondary: Holm-adjusted across the "
                   f"{summary.get('holm_family', '?')} secondary comparisons, and exploratory."), ""]
    return lines


def report_markdown(summary: dict[str, Any], figures: list[str] = ()) -> str:
    systems = summary["systems"]
    lines = [f"# Evaluation: {summary['run']}", "", *(f"{line}\n" for line in preamble(summary)),
             *primary_markdown(summary),
             *(f"![{name.removesuffix('.png')}]({name})\n" for name in figures), "## Systems", "",
             *systems_table(summary), ""]
    for name, results in summary["results"].items():
        lines += [f"## Contexts: {name}", ""]
        for level, metrics in summary["metrics"].items():
            if not metrics:
                continue
            metrics = ordered_metrics(metrics)
            lines += [f"### {LEVEL_TITLES[level]}", "", *system_table(results, level, metrics, systems), ""]
            if level == AUTOMATIC:
                lines += [("Distinct-n and Self-BLEU over a whole conversation depend on how many turns it holds (a group "
                           "writes several per block, a single assistant one), so between a group and a single "
                           "assistant only the per-turn Distinct-n (`distinct_n_per_turn`) compares like with like."), ""]
            lines += [(f"MASCOT against each baseline ({LEVEL_TITLES[level].split(' (')[0].lower()}): the paired "
                       "difference over the (context, seed) pairs both have a value for, averaged per cluster "
                       f"[interval over {resampled(summary)}], a paired sign-flip permutation p on the mean difference, "
                       + family_words(summary)
                       + unpaired_note(results, level)), "",
                      *comparison_table(results, level, metrics, systems), "",
                      *primary_note(summary, name, level), *detectable_effects(results, level, metrics, systems)]
    lines += preference_markdown(summary)
    agreement = summary["agreement"]
    lines += ["## Agreement between judges", "",
              (f"Krippendorff's alpha (interval level) on the overall score of the unit each judge rated (a companion "
               "turn at the persona level where the judgments are at hand, a conversation at the collective level), "
               "within each system (pooled across systems, the differences between systems would count as "
               f"agreement), with a {summary['confidence']:.0%} percentile bootstrap interval that resamples clusters "
               "with their rated units."), ""]
    for level, entry in agreement.items():
        if entry["judges"] < 2:
            lines.append(f"- {level}: not computable ({entry['judges']} judge).")
            continue
        unit = entry.get("unit", "conversation")
        cells = [f"{SYSTEMS[system].label} {_alpha(result, unit)}" for system, result in entry["systems"].items()]
        lines.append(f"- {level}, {entry['judges']} judges, per {unit}: " + "; ".join(cells) + ".")
    lines += ["", *splits_markdown(summary)]
    return "\n".join(lines).rstrip() + "\n"


def systems_table(summary: dict[str, Any]) -> list[str]:
    """What each system is, with its companion-token budget per block and the words it wrote, where recorded."""
    budgets = summary.get("budgets") or {}
    if not budgets:
        return ["| system | what it is |", "|---|---|",
                *(f"| {SYSTEMS[s].label} (`{s}`) | {summary['descriptions'][s]} |" for s in summary["systems"])]

    def budget(system: str) -> str:
        entry = budgets.get(system)
        if entry is None:
            return "– | – | –"
        words = "–" if entry["words_per_block"] is None else f"{entry['words_per_block']:.1f}"
        samples = entry.get("samples", 1)
        compute = (f"{samples} ({entry['generated_tokens']} tokens)" if "generated_tokens" in entry else "–")
        return f"{entry['turns']} × {entry['turn_tokens']} = {entry['block_tokens']} | {words} | {compute}"

    return [("| system | what it is | companion tokens per block (turns × cap) | words per block (mean) | "
            "Speaker samples per turn (most tokens generated per block) |"),
            "|---|---|---|---|---|",
            *(f"| {SYSTEMS[s].label} (`{s}`) | {summary['descriptions'][s]} | {budget(s)} |" for s in summary["systems"])]


SPLIT_TITLES = {"valence": "valence (Empathetic Dialogues' emotion label)", "meeting_type": "meeting domain (QMSum)"}


def splits_markdown(summary: dict[str, Any]) -> list[str]:
    """For each evaluation set and split column, the overall score of each level per system and bucket."""
    lines = []
    for name, columns in summary["splits"].items():
        for column, buckets in columns.items():
            lines += [f"### {name} by {SPLIT_TITLES[column]}", ""]
            for level in ("persona", "collective"):
                header = [f"{value} ({bucket['contexts']} context{'s' * (bucket['contexts'] != 1)})"
                          for value, bucket in buckets.items()]
                lines += [f"{LEVEL_TITLES[level]}, overall: mean ± sd [interval], n (contexts, seeds)", "",
                          "| system | " + " | ".join(header) + " |", "|---|" + "---|" * len(header)]
                for system in summary["systems"]:
                    cells = [_split_cell(bucket, level, system) for bucket in buckets.values()]
                    lines.append(f"| {SYSTEMS[system].label} | " + " | ".join(cells) + " |")
                lines.append("")
    if not lines:
        return []
    return ["## Splits", "", (f"Each evaluation set by the contexts' valence or meeting domain, where it has more "
                              f"than one. A bucket of fewer than {MIN_SPLIT_CONTEXTS} clusters (meetings, or contexts) is not "
                              "scored: it has no interval over clusters. MASCOT's paired differences within each bucket, every metric "
                              "and their Holm-adjusted p are in summary.json (`splits`)."), "", *lines]


def _split_cell(bucket: dict[str, Any], level: str, system: str) -> str:
    if bucket["results"] is None:
        return "too few clusters"
    entry = next((e for e in bucket["results"]["summaries"]
                  if e["level"] == level and e["metric"] == "overall" and e["system"] == system), None)
    return "–" if entry is None else f"{_cell(entry)}, n {entry['n']} ({entry['contexts']}, {entry['seeds']})"


def judges_of(config) -> dict[str, Any]:
    """The evaluation's panels by label, which of them is a model that also judged training data, and whether all
    are heuristic. Sharing is by the model that judges (`JudgeConfig.model_identity`), never by the label: a
    training judge renamed, or served from another address, is still the same judge."""
    evaluation = config.eval
    roles = [*(("persona", j) for j in evaluation.judges), *(("collective", j) for j in evaluation.group_judges),
             ("pairwise", evaluation.pairwise)]
    training: dict[str, list[str]] = {}
    for stage, judges in (("stage1", config.stage1.judges), ("stage2", config.stage2.judges)):
        for judge in judges:
            training.setdefault(judge.model_identity, []).append(f"{stage} '{judge.label}'")
    shared: dict[str, dict[str, Any]] = {}
    for role, judge in roles:
        if judge.model_identity in training:
            entry = shared.setdefault(judge.label, {"judge": judge.label, "model": judge.model_identity, "roles": [],
                                                    "training": sorted(set(training[judge.model_identity]))})
            entry["roles"].append(role)
    return {"persona": [j.label for j in evaluation.judges], "collective": [j.label for j in evaluation.group_judges],
            "pairwise": evaluation.pairwise.label, "shared_with_training": sorted(shared),
            "shared_models": [shared[label] for label in sorted(shared)],
            "heuristic_only": all(j.kind == "heuristic" for _, j in roles)}


def _controlled(entry: dict[str, Any] | None) -> str:
    if entry is None or entry["win_rate"] is None:
        return "– (no spread of lengths)" if entry is not None else "–"
    interval = "" if entry["ci_low"] is None else f" [{entry['ci_low']:.1%}, {entry['ci_high']:.1%}]"
    return f"{entry['win_rate']:.1%}{interval}"


def _ratio(entry: dict[str, Any] | None) -> str:
    import math

    if entry is None or entry["mean_log_length_ratio"] is None:
        return "–"
    return f"{math.exp(entry['mean_log_length_ratio']):.2f}×"


def _share(share: dict[str, Any]) -> str:
    if share["share"] is None:
        return "– (0)"
    return f"{share['share']:.1%} {bracket(share, '.1%')} ({share['n']})"


def companion_words(conversations) -> dict[tuple[str, str, int, int], int]:
    """Each conversation's companion words (system, context, seed, training seed): the length the pairwise judge
    saw."""
    from mascot.evaluation.metrics import words

    totals: dict[tuple[str, str, int, int], int] = {}
    for system, context, seed, run, role, text in with_training_seed(conversations).select(
            "system", "context_id", "seed", "training_seed", "role", "text").iter_rows():
        if role == "companion":
            key = (system, context, seed, run)
            totals[key] = totals.get(key, 0) + len(words(text or ""))
    return totals


def rubric_lines(preferences: list[dict[str, Any]]) -> list[str]:
    """Which rubric weighed each baseline against MASCOT, and a warning where a single assistant was weighed by
    the collective rubric, whose anchors score one voice low by construction."""
    by_rubric: dict[str, list[str]] = {}
    tilted = []
    for entry in preferences:
        label = SYSTEMS[entry["baseline"]].label
        by_rubric.setdefault(entry.get("rubric") or "not recorded", []).append(label)
        if not SYSTEMS[entry["baseline"]].group and entry.get("rubric") == entry.get("collective_rubric"):
            tilted.append(label)
    if not by_rubric:
        return []
    lines = ["Rubrics the judge weighed by: " + "; ".join(f"{name}: {', '.join(labels)}"
                                                           for name, labels in by_rubric.items()) + ".", ""]
    if tilted:
        lines += [(f"**Against {', '.join(tilted)} (a single assistant) the judge weighed by the collective rubric, "
                   "whose anchors score one voice low (\"one voice dominates\", \"roles blur\"): these win rates "
                   "favour the group by construction. Set eval.neutral_rubric to compare on the outcome for the "
                   "user.**"), ""]
    return lines


def preference_markdown(summary: dict[str, Any]) -> list[str]:
    judges = summary["judges"]
    lines = ["## Head-to-head preference", "",
             (f"The pairwise judge ({judges['pairwise']}) compared MASCOT's conversation with each baseline's on "
             "the same context and seed, once with MASCOT first and once second. A pair is a win or a loss when "
             "both orders agree, else a tie; the win rate counts ties as half, with a "
             f"{summary['confidence']:.0%} bootstrap interval over clusters; position consistency is the share of "
             "pairs whose verdict survived the swap; side A is the share of the judge's decisive verdicts, in both "
             "orders, that picked the continuation shown first (0.5 without position bias), with its interval."), ""]
    lines += rubric_lines(summary["preferences"])
    if judges["pairwise"] == "heuristic":
        lines += [("The heuristic pairwise judge compares scores, so it cannot favour a position: its consistency is "
                  "1 by construction, not a finding."), ""]
    lines += [("Length-controlled: the win rate at equal length, the intercept of a least-squares fit of each pair's "
               "outcome on log(MASCOT's companion words / the baseline's) [interval over clusters]; LLM judges "
               "favour longer answers, and a group writes several turns per block where a single assistant writes "
               "one. Words ratio: the geometric mean of MASCOT's words over the baseline's."), ""]
    lines += [("| MASCOT against | pairs (contexts, seeds) | wins | ties | losses | win rate | length-controlled | "
               "words ratio | position consistency | side A (n) | failed pairs |"),
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for entry in summary["preferences"]:
        rate = "–" if entry["win_rate"] is None else f"{entry['win_rate']:.1%} {bracket(entry, '.1%')}"
        consistency = "–" if entry["position_consistency"] is None else f"{entry['position_consistency']:.1%}"
        lines.append(f"| {SYSTEMS[entry['baseline']].label} | {entry['n']} ({entry['contexts']}, {entry['seeds']}) | "
                     f"{entry['wins']} | {entry['ties']} | {entry['losses']} | {rate} | "
                     f"{_controlled(entry.get('length_controlled'))} | {_ratio(entry.get('length_controlled'))} | "
                     f"{consistency} | "
                     f"{_share(entry['side_a_share'])} | {entry['failed_pairs']} |")
    return [*lines, ""]
