"""The persona reward model's persona-swap test: one reply, scored under its own persona's prompt and under
another persona's prompt of the same context.

Held-out pair accuracy compares two replies under one persona's prompt, so a reward model that scores generic
quality and ignores the persona passes it. The swap test holds the reply fixed and changes only the persona:
a model that reads the persona scores a reply in its persona's voice higher under that persona's prompt. A
comparison is won when the own prompt's score is strictly higher (a tie is a loss, as in pair accuracy).

In a Stage 1 run the replies are the chosen replies of the held-out pairs (the replies the judges preferred
under their own persona), and the other prompts are the prompts the pairs table holds for the same context's
other personas. A context whose other persona has no pair gives no comparison against that persona.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from mascot.queries import Query, cluster_ids
from mascot.stats import clustered_mean, proportion

Messages = list[dict[str, str]]
COMPARISON_SCHEMA = {"query_id": pl.String, "persona": pl.String, "other": pl.String, "text": pl.String}


def swap_comparisons(replies: pl.DataFrame, prompts: Mapping[str, Messages]) -> list[dict[str, Any]]:
    """Each reply (`query_id`, `persona`, `text`) against every other persona whose prompt for the same
    context is in `prompts` (query id -> messages): rows with the reply, both prompts, and both personas."""
    by_context: dict[str, dict[str, str]] = {}
    for query_id in prompts:
        context_id, persona = Query.split_id(query_id)
        by_context.setdefault(context_id, {})[persona] = query_id
    rows = []
    for row in replies.select("query_id", "persona", "text").iter_rows(named=True):
        context_id, _ = Query.split_id(row["query_id"])
        for other, other_query in sorted(by_context.get(context_id, {}).items()):
            if other != row["persona"]:
                rows.append({**row, "other": other, "own_prompt": prompts[row["query_id"]],
                             "other_prompt": prompts[other_query]})
    return rows


def persona_swap_accuracy(model: Any, comparisons: list[dict[str, Any]], confidence: float = 0.95,
                          clusters: Mapping[str, str] | None = None) -> dict:
    """Share of comparisons in which `model` (a `RewardModelScorer`: `score(prompts, replies)`) scores the reply
    higher under its own persona's prompt, with its Wilson interval (over comparisons, as if independent), an
    interval that resamples the contexts' clusters (`cluster_ids`: the comparisons of one context are not
    independent), and per persona."""
    if not comparisons:
        return {"accuracy": proportion(0, 0, confidence), "accuracy_by_context": clustered_mean([], [], confidence),
                "by_persona": {}, "replies": 0}
    texts = [c["text"] for c in comparisons]
    own = model.score([c["own_prompt"] for c in comparisons], texts)
    other = model.score([c["other_prompt"] for c in comparisons], texts)
    frame = pl.DataFrame([{key: c[key] for key in COMPARISON_SCHEMA} for c in comparisons], schema=COMPARISON_SCHEMA)
    frame = frame.with_columns(won=pl.Series([o > s for o, s in zip(own, other, strict=True)]))
    by_persona = {persona: proportion(int(rows["won"].sum()), rows.height, confidence)
                  for (persona,), rows in sorted(frame.group_by("persona"), key=lambda item: item[0])}
    return {"accuracy": proportion(int(frame["won"].sum()), frame.height, confidence),
            "accuracy_by_context": clustered_mean(frame["won"].cast(pl.Float64).to_list(),
                                                  cluster_ids(frame["query_id"], clusters), confidence),
            "by_persona": by_persona, "replies": frame.select("query_id", "text").unique().height}


def held_out_persona_swap(model: Any, pairs: pl.DataFrame, clusters: Mapping[str, str] | None = None) -> dict:
    """The swap test on held-out pairs (`query_id`, `persona`, `prompt`, `chosen`): each query's chosen replies
    against the other personas' prompts for the same context. A `train_reward_model` held-out measure."""
    if pairs.is_empty():
        return persona_swap_accuracy(model, [])
    replies = pairs.select("query_id", "persona", text="chosen").unique(maintain_order=True)
    prompts = dict(zip(pairs["query_id"].to_list(), pairs["prompt"].to_list(), strict=True))
    return persona_swap_accuracy(model, swap_comparisons(replies, prompts), clusters=clusters)
