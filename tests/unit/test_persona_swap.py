"""The persona reward model's persona-swap test: which comparisons it makes, how it counts them, how it is reported."""

from __future__ import annotations

import polars as pl
import pytest

from mascot.stage1.persona_swap import held_out_persona_swap, persona_swap_accuracy, swap_comparisons
from mascot.stage1.report import reward_model_markdown
from mascot.stats import clustered_mean, describe, proportion

PERSONAS = ("anchor", "beacon", "catalyst")


def prompt(persona: str, context: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"You are {persona}."}, {"role": "user", "content": f"context {context}"}]


class PersonaWordScorer:
    """A reward model that knows the persona: 1 when the reply names the prompt's persona, 0 otherwise (a tie
    between two prompts that the reply does not name); `persona_blind` scores every prompt alike."""

    def __init__(self, persona_blind: bool = False):
        self.persona_blind = persona_blind

    def score(self, prompts, replies):
        if self.persona_blind:
            return [float(len(reply)) for reply in replies]
        return [float(p[0]["content"].removeprefix("You are ").rstrip(".") in reply) for p, reply in
                zip(prompts, replies, strict=True)]


def pairs_frame(rows: list[tuple[str, str, str]]) -> pl.DataFrame:
    """Held-out pairs as Stage 1 writes them, from (context, persona, chosen) rows."""
    return pl.DataFrame({"query_id": [f"{c}|{p}" for c, p, _ in rows], "persona": [p for _, p, _ in rows],
                         "prompt": [prompt(p, c) for c, p, _ in rows], "chosen": [t for _, _, t in rows],
                         "rejected": ["-"] * len(rows)})


def test_each_reply_meets_every_other_persona_of_its_context_and_no_other_context():
    replies = pl.DataFrame({"query_id": ["c1|anchor", "c2|beacon"], "persona": ["anchor", "beacon"],
                            "text": ["a", "b"]})
    prompts = {f"c1|{p}": prompt(p, "c1") for p in PERSONAS} | {"c2|beacon": prompt("beacon", "c2"),
                                                                "c2|anchor": prompt("anchor", "c2")}
    comparisons = swap_comparisons(replies, prompts)
    assert [(c["query_id"], c["other"]) for c in comparisons] == [
        ("c1|anchor", "beacon"), ("c1|anchor", "catalyst"), ("c2|beacon", "anchor")]
    first = comparisons[0]
    assert first["own_prompt"] == prompt("anchor", "c1") and first["other_prompt"] == prompt("beacon", "c1")


def test_accuracy_counts_own_persona_wins_and_a_tie_as_a_loss_with_its_wilson_interval():
    # c1's anchor reply names its persona: it wins against both others. c1's beacon reply names the anchor: under
    # the anchor's prompt it scores higher, a loss; under the catalyst's both score 0, a tie, also a loss.
    pairs = pairs_frame([("c1", "anchor", "anchor words"), ("c1", "beacon", "anchor words too"),
                         ("c1", "catalyst", "catalyst"), ("c2", "anchor", "anchor"), ("c2", "beacon", "beacon")])
    swap = held_out_persona_swap(PersonaWordScorer(), pairs)
    # Comparisons: c1 anchor 2 wins, c1 beacon 0 of 2, c1 catalyst 2 wins, c2 anchor 1, c2 beacon 1: 6 of 8.
    assert swap["accuracy"] == proportion(6, 8) and swap["replies"] == 5
    assert swap["accuracy"]["ci_low"] < 0.75 < swap["accuracy"]["ci_high"]
    assert swap["by_persona"] == {"anchor": proportion(3, 3), "beacon": proportion(1, 3),
                                  "catalyst": proportion(2, 2)}
    assert swap["accuracy_by_context"] == clustered_mean([1, 1, 0, 0, 1, 1, 1, 1], ["c1"] * 6 + ["c2"] * 2)
    # Windows of one meeting: the interval resamples the meeting, once.
    one_meeting = held_out_persona_swap(PersonaWordScorer(), pairs, clusters={"c1": "m", "c2": "m"})
    assert one_meeting["accuracy_by_context"] == clustered_mean([1, 1, 0, 0, 1, 1, 1, 1], ["m"] * 8)


def test_a_persona_blind_model_wins_no_comparison():
    pairs = pairs_frame([("c1", p, f"{p} reply") for p in PERSONAS])
    assert held_out_persona_swap(PersonaWordScorer(persona_blind=True), pairs)["accuracy"] == proportion(0, 6)


def test_one_chosen_reply_of_several_pairs_is_compared_once():
    pairs = pairs_frame([("c1", "anchor", "anchor"), ("c1", "anchor", "anchor"), ("c1", "beacon", "beacon")])
    swap = held_out_persona_swap(PersonaWordScorer(), pairs)
    assert swap["accuracy"]["n"] == 2 and swap["replies"] == 2


@pytest.mark.parametrize("pairs", [pairs_frame([]), pairs_frame([("c1", "anchor", "anchor")])])
def test_no_comparison_is_n_zero_not_a_share(pairs):
    swap = held_out_persona_swap(PersonaWordScorer(), pairs)
    assert swap["accuracy"] == proportion(0, 0) and persona_swap_accuracy(PersonaWordScorer(), [])["replies"] == 0


def reward_model_metrics(swap: dict | None) -> dict:
    accuracy = proportion(8, 10)
    held_out = {"accuracy": accuracy, "accuracy_by_context": clustered_mean([1.0] * 8 + [0.0] * 2, ["c1"] * 5 + ["c2"] * 5),
                "by_persona": {"anchor": accuracy}, "margin": describe([]), "margin_histogram": {}}
    if swap is not None:
        held_out["persona_swap"] = swap
    return {"held_out": held_out, "train": {"accuracy": proportion(9, 10)},
            "training": {"steps": 4, "train_pairs": 10, "held_out_pairs": 10, "held_out_contexts": ["c1", "c2"]}}


def test_the_report_gives_persona_swap_accuracy_with_its_intervals_and_n():
    pairs = pairs_frame([("c1", "anchor", "anchor words"), ("c1", "beacon", "anchor words too"),
                         ("c1", "catalyst", "catalyst"), ("c2", "anchor", "anchor"), ("c2", "beacon", "beacon")])
    text = "\n".join(reward_model_markdown(reward_model_metrics(held_out_persona_swap(PersonaWordScorer(), pairs))))
    wilson = proportion(6, 8)
    assert f"Persona-swap accuracy: 75.0% [{wilson['ci_low']:.1%}, {wilson['ci_high']:.1%}] (n=8)" in text
    assert "of 5 held-out chosen replies" in text and "(n=8 from 2 clusters)" in text
    assert "By persona: anchor 100.0% [" in text and "beacon 33.3% [" in text


def test_the_report_says_when_no_swap_could_be_made_and_leaves_it_out_of_older_metrics():
    text = "\n".join(reward_model_markdown(reward_model_metrics(persona_swap_accuracy(PersonaWordScorer(), []))))
    assert "Persona-swap accuracy: n/a (n=0)" in text
    assert "Persona-swap" not in "\n".join(reward_model_markdown(reward_model_metrics(None)))
