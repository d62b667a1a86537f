"""The evaluation's headline table in the terminal: what `mascot run evaluate` and `pipeline` end with."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from mascot.evaluation.report import HEADLINE, bracket, counted
from mascot.evaluation.systems import SYSTEMS


def primary_line(summary: dict) -> str:
    """The pre-declared primary endpoint's difference, interval and p, as the report's first section gives it."""
    primary = summary.get("primary") or {}
    declared, entry = primary.get("declared") or {}, primary.get("comparison")
    if not declared.get("baseline"):
        return ""
    what = (f"primary endpoint: MASCOT - {SYSTEMS[declared['baseline']].label}, {declared['metric']} "
            f"({declared['level']}, {declared['eval_set']}): ")
    if entry is None or entry["mean"] is None:
        return what + "not computed\n"
    return what + (f"{entry['mean']:+.1f} {bracket(entry, '+.1f')}, p {entry['p']:.3f}, "
                   f"{counted(entry['clusters'], 'cluster')}\n")


def headline_table(summary_path: Path) -> Table:
    """Each system's headline criteria (persona level) and collective overall score on all evaluation
    contexts, mean [interval over contexts], and MASCOT's pairwise win rate against it."""
    summary = json.loads(summary_path.read_text())
    entries = {(e["level"], e["metric"], e["system"]): e for e in summary["results"]["all"]["summaries"]}
    wins = {e["baseline"]: e for e in summary["preferences"]}
    columns = [("persona", metric) for metric in HEADLINE] + [("collective", "overall")]
    first = next(iter(entries.values()))
    table = Table(title=f"Evaluation of {summary['run']}: {first['contexts']} contexts, {len(summary['seeds'])} "
                        f"seed(s), 0-100, mean [{summary['confidence']:.0%} interval over clusters]",
                  caption=primary_line(summary) + f"judges: {', '.join(summary['judges']['persona'])}"
                          + (" (heuristic: pipeline checks, not research claims)"
                             if summary["judges"]["heuristic_only"] else ""))
    table.add_column("system")
    for level, metric in columns:
        table.add_column(f"{metric.replace('_', ' ')} ({level})", justify="right")
    table.add_column("MASCOT's win rate against it", justify="right")
    for system in summary["systems"]:
        cells = []
        for level, metric in columns:
            entry = entries.get((level, metric, system))
            cells.append("–" if entry is None or entry["mean"] is None else
                         f"{entry['mean']:.1f} {bracket(entry, '.1f')}")
        win = wins.get(system)
        cells.append("" if win is None or win["win_rate"] is None else
                     f"{win['win_rate']:.0%} {bracket(win, '.0%')} (n={win['n']})")
        table.add_row(SYSTEMS[system].label, *cells)
    return table
