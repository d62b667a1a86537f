"""The report's parts. Results by split: each evaluation set by valence (or meeting domain) where it has
more than one, a bucket's numbers computed on its own contexts only, and too small a bucket listed but
not scored. Figures: one per level and the ablations', embedded in report.md."""

from __future__ import annotations

import polars as pl
import pytest

from mascot.evaluation.report import report_markdown
from mascot.evaluation.results import build_summary, split_results
from mascot.evaluation.scoring import SCORE_SCHEMA

# held_out: three negative contexts, two positive, one neutral; esconv: all negative (no split).
CONTEXTS = pl.DataFrame({
    "context_id": ["n1", "n2", "n3", "p1", "p2", "u1", "e1", "e2"],
    "eval_set": ["held_out"] * 6 + ["esconv:test"] * 2,
    "valence": ["negative"] * 3 + ["positive"] * 2 + ["neutral"] + ["negative"] * 2,
    "meeting_type": [None] * 8}, schema_overrides={"meeting_type": pl.String})
MASCOT = {"n1": 60, "n2": 70, "n3": 80, "p1": 40, "p2": 50, "u1": 90, "e1": 10, "e2": 20}


def scores() -> pl.DataFrame:
    rows = []
    for system, shift in (("mascot", 0), ("multi_agent", -10)):
        for context, value in MASCOT.items():
            for level in ("persona", "collective"):
                rows.append({"system": system, "context_id": context, "seed": 0, "level": level, "metric": "overall",
                             "judge": "heuristic", "value": float(value + shift)})
    return pl.DataFrame(rows, schema=SCORE_SCHEMA)


def test_each_bucket_is_scored_on_its_own_contexts():
    splits = split_results(scores(), CONTEXTS, ["mascot", "multi_agent"], resamples=200)
    assert set(splits) == {"held_out"} and set(splits["held_out"]) == {"valence"}  # esconv has one valence
    buckets = splits["held_out"]["valence"]
    assert {value: bucket["contexts"] for value, bucket in buckets.items()} == {"negative": 3, "neutral": 1,
                                                                                "positive": 2}
    assert buckets["neutral"]["results"] is None  # one context: no interval over contexts
    negative = {(e["system"], e["level"]): e for e in buckets["negative"]["results"]["summaries"]}
    assert negative[("mascot", "persona")]["mean"] == pytest.approx(70.0)
    assert negative[("multi_agent", "collective")]["mean"] == pytest.approx(60.0)
    assert negative[("mascot", "persona")]["sd"] == pytest.approx(10.0) and negative[("mascot", "persona")]["contexts"] == 3
    [difference] = [c for c in buckets["positive"]["results"]["comparisons"] if c["level"] == "persona"]
    assert difference["baseline"] == "multi_agent" and difference["mean"] == pytest.approx(10.0)


def test_the_report_shows_every_bucket_with_its_n_or_says_it_is_too_small():
    summary = build_summary("r", ["mascot", "multi_agent"], [0], {
        "persona": ["heuristic"], "collective": ["heuristic"], "pairwise": "heuristic", "shared_with_training": [],
        "heuristic_only": True}, CONTEXTS, scores(),
        pl.DataFrame({"role": ["companion"], "reasoning_marked": [None]}, schema_overrides={"reasoning_marked": pl.Boolean}),
        resamples=200)
    summary["preferences"] = []
    # One Holm family: 2 levels in each of 3 sets (all, held_out, esconv) and in the two scored valence buckets.
    split_comparisons = [c for bucket in summary["splits"]["held_out"]["valence"].values() if bucket["results"]
                         for c in bucket["results"]["comparisons"]]
    assert len(split_comparisons) == 4 and summary["holm_family"] == 3 * 2 + 4
    assert {c["holm_family"] for c in split_comparisons} == {"every comparison of the report (10)"}
    report = report_markdown(summary, ["figure_persona.png"])
    assert "Holm-adjusted across all 10 comparisons of this report" in report
    assert "![figure_persona](figure_persona.png)" in report.split("## Systems")[0]
    section = report.split("## Splits")[1]
    assert "### held_out by valence" in section and "esconv:test by" not in section
    assert "| negative (3 contexts) | neutral (1 context) | positive (2 contexts) |" in section
    rows = [line for line in section.splitlines() if line.startswith("| MASCOT |")]
    assert len(rows) == 2  # persona and collective
    assert rows[0].startswith("| MASCOT | 70.0 ± 10.0 [") and "n 3 (3, 1)" in rows[0] and "too few clusters" in rows[0]


def test_figures_are_pngs_of_every_level_and_the_ablations_and_the_report_embeds_them(tmp_path):
    from PIL import Image

    from mascot.evaluation.report import write_figures

    rows = []
    for system in ("mascot", "mascot_p", "zero_shot"):
        for level in ("persona", "collective"):
            for metric in ("persona_consistency", "overall"):
                rows.append({"system": system, "level": level, "metric": metric, "mean": 50.0, "ci_low": 45.0,
                             "ci_high": 55.0})
    summary = {"results": {"all": {"summaries": rows}}, "systems": ["mascot", "mascot_p", "zero_shot"],
               "metrics": {"persona": ["persona_consistency", "overall"], "collective": ["overall"], "automatic": []},
               "confidence": 0.95, "run": "r"}
    figures = write_figures(summary, tmp_path)
    assert set(figures) == {"eval/figure_persona", "eval/figure_collective", "eval/figure_ablation"}
    for artifact in figures.values():
        with Image.open(artifact.verified()) as image:
            assert image.format == "PNG" and image.width > 400 and image.height > 200
    summary["systems"] = ["mascot", "multi_agent"]  # one ablation system alone: nothing to set beside MASCOT
    assert "eval/figure_ablation" not in write_figures(summary, tmp_path / "no-ablation")


def test_collective_scores_and_differences_are_among_group_systems_only():
    """The collective rubric scores one voice low by construction: a single assistant is not scored or compared
    on it, while it is on the persona level."""
    frame = pl.concat([scores(), scores().filter(pl.col("system") == "multi_agent").with_columns(
        system=pl.lit("zero_shot"))])
    results = split_results(frame, CONTEXTS, ["mascot", "multi_agent", "zero_shot"], resamples=100)
    negative = results["held_out"]["valence"]["negative"]["results"]
    by_level = {(e["system"], e["level"]) for e in negative["summaries"]}
    assert ("zero_shot", "persona") in by_level and ("zero_shot", "collective") not in by_level
    assert ("multi_agent", "collective") in by_level
    compared = {(c["baseline"], c["level"]) for c in negative["comparisons"]}
    assert compared == {("multi_agent", "persona"), ("multi_agent", "collective"), ("zero_shot", "persona")}


def test_the_report_states_each_systems_token_budget_and_whether_they_match():
    from mascot.evaluation.report import budget_summary

    conversations = pl.DataFrame({
        "system": ["mascot", "mascot", "mascot", "zero_shot", "zero_shot"], "context_id": ["c"] * 5, "seed": [0] * 5,
        "block": [0, 0, 1, 0, 1], "role": ["companion"] * 5, "text": ["a b", "c d e", "f", "g h i j", "k l"]})
    budgets = budget_summary({"mascot": {"turns": 2, "turn_tokens": 40, "block_tokens": 80},
                              "zero_shot": {"turns": 1, "turn_tokens": 80, "block_tokens": 80, "samples": 5,
                                            "generated_tokens": 400}}, conversations)
    assert budgets["mascot"]["words_per_block"] == pytest.approx(3.0)  # (2 + 3) and 1 words in its two blocks
    assert budgets["zero_shot"]["words_per_block"] == pytest.approx(3.0)
    summary = build_summary("r", ["mascot", "zero_shot"], [0], {
        "persona": ["heuristic"], "collective": ["heuristic"], "pairwise": "heuristic", "shared_with_training": [],
        "heuristic_only": True}, CONTEXTS, scores(), conversations.with_columns(reasoning_marked=pl.lit(None, pl.Boolean)),
        resamples=100) | {"preferences": [], "budgets": budgets}
    report = report_markdown(summary)
    assert "Budgets are matched: every system may write 80 companion tokens per block" in report
    assert ("Training seeds: 1 (eval.training_seeds). The 1 seed(s) are evaluation sampling seeds over this run's "
            "one training") in report and "not of training" in report
    three = report_markdown(summary | {"training_seeds": 3})
    assert "Training seeds: 3 (eval.training_seeds)" in three and "trained 3 times" in three
    assert "so they hold training variance" in three and "not of training" not in three
    assert "interval over clusters;" in report and "interval over clusters and training seeds;" in three
    assert "| MASCOT (`mascot`) |" in report and "| 2 × 40 = 80 | 3.0 |" in report and "| 1 × 80 = 80 | 3.0 | 5 (400 tokens) |" in report
    summary["budgets"]["zero_shot"] |= {"turn_tokens": 40, "block_tokens": 40}
    assert "**Budgets are not matched: companion tokens per block range over 40, 80**" in report_markdown(summary)


def test_the_primary_endpoint_comes_first_alone_and_every_other_comparison_is_secondary_under_holm():
    from mascot.evaluation.statistics import holm

    judges = {"persona": ["heuristic"], "collective": ["heuristic"], "pairwise": "heuristic",
              "shared_with_training": [], "heuristic_only": True}
    conversations = pl.DataFrame({"role": ["companion"], "reasoning_marked": [None]},
                                 schema_overrides={"reasoning_marked": pl.Boolean})
    primary = {"baseline": "multi_agent", "level": "collective", "metric": "overall", "eval_set": "held_out"}
    summary = build_summary("r", ["mascot", "multi_agent"], [0], judges, CONTEXTS, scores(), conversations,
                            resamples=100, primary=primary) | {"preferences": []}
    chosen = summary["primary"]["comparison"]
    assert (chosen["baseline"], chosen["level"], chosen["metric"]) == ("multi_agent", "collective", "overall")
    assert chosen in summary["results"]["held_out"]["comparisons"] and chosen["role"] == "primary"
    assert chosen["p_holm"] == chosen["p"]  # tested alone, at its own p
    family = [c for r in summary["results"].values() for c in r["comparisons"]]
    family += [c for b in summary["splits"]["held_out"]["valence"].values() if b["results"]
               for c in b["results"]["comparisons"]]
    secondary = [c for c in family if c is not chosen]
    assert summary["holm_family"] == len(secondary) == 9 and {c["role"] for c in secondary} == {"secondary"}
    assert [c["p_holm"] for c in secondary] == holm([c["p"] for c in secondary])
    report = report_markdown(summary)
    assert report.index("## Primary endpoint") < report.index("## Systems") < report.index("## Contexts")
    first = report.split("## Systems")[0]
    assert "MASCOT − Multi-agent (untrained) on overall (collective), contexts held_out" in first
    assert f"p = {chosen['p']:.3f}" in first and "Holm-adjusted across the 9 secondary comparisons" in first
    assert report.count("**Primary endpoint:** the overall cell of − Multi-agent (untrained)") == 1
    # Each comparison states its minimum detectable effect at 80% power, at the level its test must clear.
    from mascot.evaluation.statistics import minimum_detectable_effect

    assert chosen["mde"] == pytest.approx(minimum_detectable_effect(chosen["sd"], chosen["clusters"], 0.05))
    for entry in secondary:
        assert entry["mde_alpha"] == pytest.approx(0.05 / 9) and entry["mde_power"] == 0.8
        assert entry["mde"] == pytest.approx(minimum_detectable_effect(entry["sd"], entry["clusters"], 0.05 / 9))
    assert f"minimum detectable effect at 80% power {chosen['mde']:.3g} (two-sided α 0.05)" in first
    assert "Holm's first step, alpha / 9 = 0.0056" in report and "| MDE against | clusters |" in report
    # A primary endpoint the evaluation did not make is said to be missing, and nothing is primary.
    missing = build_summary("r", ["mascot", "multi_agent"], [0], judges, CONTEXTS, scores(), conversations,
                            resamples=100, primary={**primary, "metric": "warmth"}) | {"preferences": []}
    assert missing["primary"]["comparison"] is None and missing["holm_family"] == 10
    assert "**Not computed" in report_markdown(missing)


def test_the_report_states_the_cot_reasoning_budget_attempts_and_failures_per_system():
    from mascot.evaluation.report import cot_line
    from mascot.evaluation.results import reasoning_counts

    conversations = pl.DataFrame({"system": ["zero_shot_cot"] * 3 + ["few_shot_cot"] * 2 + ["mascot"],
                                  "role": ["companion"] * 6, "reasoning_marked": [True, False, False, True, True, None]})
    counts = reasoning_counts(conversations)
    assert counts["turns"] == 5 and counts["unmarked"] == 2
    assert counts["by_system"] == {"zero_shot_cot": {"turns": 3, "failed": 2}, "few_shot_cot": {"turns": 2, "failed": 0}}
    budgets = {name: {"reasoning_tokens": 256, "attempts": 3} for name in ("zero_shot_cot", "few_shot_cot")}
    line = cot_line({"marker": "Reply:", **counts}, budgets)
    assert "may reason in 256 tokens of its own" in line and "sampled up to 3 time(s)" in line
    assert "**2 of 5 CoT turns had no marker after every attempt** (Zero-Shot CoT 2 of 3; Few-Shot CoT 0 of 2)" in line
    assert "each judged whole, reasoning included" in line and "never judged" not in line  # those 2 were judged whole
    marked = reasoning_counts(conversations.filter(pl.col("system") == "few_shot_cot"))
    line = cot_line({"marker": "Reply:", **marked}, budgets)
    assert "All 2 CoT turns had their marker." in line and "the reasoning before it is never judged" in line


def test_the_terminal_headline_gives_the_primary_endpoint(tmp_path):
    import json

    from cli.headline import headline_table, primary_line

    declared = {"baseline": "multi_agent", "level": "collective", "metric": "overall", "eval_set": "held_out"}
    entry = {"mean": 4.25, "ci_low": -1.0, "ci_high": 9.5, "p": 0.125, "clusters": 6}
    assert primary_line({"primary": {"declared": declared, "comparison": entry}}) == (
        "primary endpoint: MASCOT - Multi-agent (untrained), overall (collective, held_out): +4.2 [-1.0, +9.5], "
        "p 0.125, 6 clusters\n")
    assert primary_line({"primary": {"declared": declared, "comparison": None}}).endswith("not computed\n")
    assert primary_line({}) == ""
    summary = {"run": "r", "seeds": [0], "confidence": 0.95, "systems": ["mascot"], "preferences": [],
               "judges": {"persona": ["heuristic"], "heuristic_only": True},
               "results": {"all": {"summaries": [{"level": "persona", "metric": "overall", "system": "mascot",
                                                  "contexts": 6, "mean": 50.0, "ci_low": 40.0, "ci_high": 60.0}]}},
               "primary": {"declared": declared, "comparison": entry}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert headline_table(tmp_path / "summary.json").caption.startswith("primary endpoint: MASCOT - Multi-agent")


def test_a_held_out_set_of_one_meeting_reads_as_without_interval_in_the_report_and_the_headline(tmp_path):
    """The tiny meetings profile holds out one meeting: its windows are one cluster, so no figure on that set has an
    interval, and the report and the terminal's primary line say so rather than print a zero-width one."""
    from cli.headline import primary_line

    judges = {"persona": ["heuristic"], "collective": ["heuristic"], "pairwise": "heuristic",
              "shared_with_training": [], "heuristic_only": True}
    conversations = pl.DataFrame({"role": ["companion"], "reasoning_marked": [None]},
                                 schema_overrides={"reasoning_marked": pl.Boolean})
    one_meeting = CONTEXTS.with_columns(cluster=pl.when(pl.col("eval_set") == "held_out").then(pl.lit("meeting-1"))
                                        .otherwise(pl.col("context_id")))
    primary = {"baseline": "multi_agent", "level": "collective", "metric": "overall", "eval_set": "held_out"}
    summary = build_summary("r", ["mascot", "multi_agent"], [0], judges, one_meeting, scores(), conversations,
                            resamples=100, primary=primary) | {"preferences": []}
    report = report_markdown(summary)
    assert "- **Primary:** +10.0 [no interval: 1 cluster], 1 cluster (" in report
    assert "| MASCOT | 6 (6, 1) | 65.0 ± 18.7 [no interval: 1 cluster] |" in report  # held_out, persona level
    assert "| MASCOT | 2 (2, 1) | 15.0 ± 7.1 [10.0, 20.0] |" in report  # esconv's two contexts are two clusters
    assert "+10.0 [no interval: 1 cluster], p 1.000, 1 cluster" in primary_line(summary)
    from mascot.evaluation.plots import system_dot_plot  # the dot alone, without a bar

    held = {(e["system"], e["metric"]): e for e in summary["results"]["held_out"]["summaries"] if e["level"] == "persona"}
    assert system_dot_plot(held, ["mascot", "multi_agent"], {"mascot": "MASCOT", "multi_agent": "Multi-agent"},
                           ["overall"], "held_out", tmp_path / "figure.png").path.stat().st_size > 0
