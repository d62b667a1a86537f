"""The parts of the known-optimum checks that need no model: the planted rewards and judge, their controls, the
target, the vocabulary table."""

from __future__ import annotations

import json

import pytest

from mascot.known_optima.director_grpo import ArmResult, PlantedReward, director_world, pick_target, shares
from mascot.known_optima.speaker_persona import (
    ArmReward,
    PlantedPersonaJudge,
    diagonal_minus_off_diagonal,
    lexicon_hits,
    vocabulary_table,
)
from mascot.roster import load_roster


@pytest.fixture(scope="module")
def roster(tiny_config):
    return load_roster(tiny_config.data.roster)


def directive(speaker: str) -> list[dict]:
    return [{"role": "assistant", "content": json.dumps({"next_speaker": speaker, "instruction": "Listen.",
                                                          "tone": None})}]


def test_planted_reward_pays_the_target_only_and_its_sign_flips(roster):
    completions = [directive("anchor"), directive("beacon"), [{"role": "assistant", "content": "no directive"}],
                   directive("nobody")]
    assert PlantedReward(roster, "anchor")([], completions) == [1.0, 0.0, 0.0, 0.0]
    assert PlantedReward(roster, "anchor", sign=-1.0)([], completions) == [-1.0, -0.0, -0.0, -0.0]
    assert PlantedReward(roster, "anchor").__name__ == "planted"


def test_shuffled_rewards_keep_their_values_and_lose_their_completions(roster):
    completions = [directive("anchor")] * 4 + [directive("catalyst")] * 12
    shuffled = PlantedReward(roster, "anchor", shuffle_seed=0)
    batches = [shuffled([], completions) for _ in range(20)]
    assert all(sorted(batch) == [0.0] * 12 + [1.0] * 4 for batch in batches)
    # The target's completions (the first four) get no more than their share of the reward.
    paid = sum(sum(batch[:4]) for batch in batches) / sum(sum(batch) for batch in batches)
    assert paid < 0.5


def test_target_is_a_persona_sampling_reaches_but_has_not_settled_on(roster):
    assert pick_target({"anchor": 0.6, "catalyst": 0.28, "beacon": 0.12, "invalid": 0.0}, roster) == "catalyst"
    assert pick_target({"anchor": 0.45, "catalyst": 0.2, "beacon": 0.35, "invalid": 0.0}, roster) == "beacon"
    with pytest.raises(ValueError, match=r"no persona has a base share between 0.15 and 0.5.*anchor"):
        pick_target({"anchor": 0.9, "catalyst": 0.1, "beacon": 0.0, "invalid": 0.0}, roster)


def test_shares_count_invalid_samples_in_the_denominator(roster):
    assert shares({"a": ["anchor", None], "b": ["anchor", "beacon"]}, roster) == {
        "anchor": 0.5, "catalyst": 0.0, "beacon": 0.25, "invalid": 0.25}


def test_world_holds_out_contexts_the_training_prompts_never_show(roster):
    world = director_world(roster)
    assert len(world.training) == 40 and len(world.held_out) == 20
    assert not {p.messages[-1]["content"] for p in world.training} & {p.messages[-1]["content"] for p in world.held_out}


@pytest.mark.parametrize(("expected", "low", "high", "passed"), [
    ("rise", 0.01, 0.2, True), ("rise", -0.01, 0.2, False), ("fall", -0.2, -0.01, True), ("fall", -0.2, 0.0, False),
    ("stay", -0.1, 0.1, True), ("stay", 0.01, 0.1, False), ("stay", -0.1, -0.01, False)])
def test_an_arm_passes_only_when_its_interval_says_what_it_must(expected, low, high, passed):
    arm = ArmResult("arm", expected, 0.3, 0.3, {"mean": (low + high) / 2, "ci_low": low, "ci_high": high, "n": 20})
    assert arm.passed is passed


# Check 3: the planted persona judge, the reward model's reward with the arms' controls, the vocabulary table.

def reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_lexicon_hits_count_distinct_entries_as_whole_words_ignoring_case():
    lexicon = ["feel", "feeling", "makes sense", "here"]
    assert lexicon_hits("I Feel it. Feeling, feel, feel: that makes sense", lexicon) == 3
    assert lexicon_hits("feelings are there; nowhere makes  sense", lexicon) == 0


def test_planted_judge_pays_own_words_and_charges_other_personas_words(roster):
    judge = PlantedPersonaJudge(roster)
    text = "I hear you, and that is valid. A small step?"
    assert judge.score(text, "anchor") == 2 - 2 and judge.score(text, "catalyst") == 2 - 2
    assert judge.score("That sounds heavy; I hear you.", "anchor") == 3.0
    assert judge.score("That sounds heavy; I hear you.", "beacon") == -3.0
    with pytest.raises(ValueError, match="'nobody' is not an active persona"):
        judge.score("anything", "nobody")


def test_planted_judge_refuses_a_roster_whose_vocabularies_overlap(roster):
    personas = [p.model_copy(update={"lexicon": [*p.lexicon, "shared"]}) if p.id in ("anchor", "beacon") else p
                for p in roster.personas]
    with pytest.raises(ValueError, match=r"'shared' belongs to both 'anchor' and 'beacon'"):
        PlantedPersonaJudge(roster.model_copy(update={"personas": personas}))


class FixedScorer:
    __name__ = "persona_rm"

    def __call__(self, prompts, completions, **_):
        return [float(len(c[-1]["content"])) for c in completions]


def test_arm_reward_keeps_the_reward_models_name_and_flips_or_shuffles_its_scores():
    completions = [reply("a" * n) for n in range(1, 9)]
    assert ArmReward(FixedScorer())([], completions) == [float(n) for n in range(1, 9)]
    assert ArmReward(FixedScorer(), sign=-1.0)([], completions) == [-float(n) for n in range(1, 9)]
    assert ArmReward(FixedScorer()).__name__ == "persona_rm"
    shuffled = [ArmReward(FixedScorer(), shuffle_seed=0)([], completions) for _ in range(5)]
    assert all(sorted(batch) == [float(n) for n in range(1, 9)] for batch in shuffled)
    assert any(batch != [float(n) for n in range(1, 9)] for batch in shuffled)


def test_diagonal_minus_off_diagonal_is_per_context_over_its_persona_prompts():
    use = {"c1|anchor": {"anchor": 1.0, "catalyst": 0.5, "beacon": 0.0},
           "c1|beacon": {"anchor": 0.2, "catalyst": 0.2, "beacon": 0.2},
           "c2|catalyst": {"anchor": 1.0, "catalyst": 0.0, "beacon": 0.0}}
    assert diagonal_minus_off_diagonal(use) == pytest.approx({"c1": (0.75 + 0.0) / 2, "c2": -0.5})
    assert vocabulary_table(use)["anchor"] == {"anchor": 1.0, "catalyst": 0.5, "beacon": 0.0}


def test_the_linear_reference_reads_which_persona_owns_a_token_and_loses_it_through_a_narrow_code():
    """Persona a's own token is 1 and b's is 2: a's chosen reply holds 1 where its rejected one holds 2, b's the
    other way round, among filler tokens. Only a score that crosses tokens with the persona ranks these pairs; a
    one-dimensional code of 200 tokens drowns the two in the fillers."""
    import random

    from mascot.known_optima.linear_reference import Pair, linear_reference

    rng = random.Random(0)

    def reply(own: int) -> str:
        return " ".join(map(str, [own, *rng.sample(range(3, 200), 8)]))

    def pairs(count: int) -> list[Pair]:
        return [Pair(persona, reply(own), reply(3 - own)) for persona, own in [("a", 1), ("b", 2)] * (count // 2)]

    def tokenize(text: str) -> list[int]:
        return [int(token) for token in text.split()]

    train, held_out = pairs(200), pairs(100)
    assert linear_reference(train, held_out, tokenize, 200) >= 0.95
    assert linear_reference(train, held_out, tokenize, 200, width=1) <= 0.75


def test_check_2_reports_the_fitting_share_among_the_directors_own_valid_directives(tmp_path):
    """An invalid directive is played by the fallback's random persona: the fitting share counts it, the fitting share
    among valid directives does not, so the report tells a Director that chose better from one that failed less."""
    import polars as pl

    from mascot.artifacts import Artifact
    from mascot.config import DirectorEvalConfig
    from mascot.known_optima.stage2_chain import ChainCheck, _measure, cue_contexts

    contexts, held_out = cue_contexts()
    listen = next(c for c in contexts if c.id in held_out and c.metadata["cue"] == "listen")
    state = f"{listen.id}|0"
    # base: 2 valid (1 fits), 2 fallbacks that happen to fit; trained: 4 valid, 2 fit
    rows = [("base", True, "anchor"), ("base", True, "beacon"), ("base", False, "anchor"), ("base", False, "anchor"),
            ("director", True, "anchor"), ("director", True, "anchor"), ("director", True, "beacon"),
            ("director", True, "catalyst")]
    compared, group_rm = tmp_path / "compared", tmp_path / "group_rm"
    compared.mkdir(), group_rm.mkdir()
    pl.DataFrame({"state_id": [state] * len(rows), "policy": [r[0] for r in rows], "valid": [r[1] for r in rows],
                  "next_speaker": [r[2] for r in rows]}).write_parquet(compared / "samples.parquet")
    gain = {"mean": 0.0, "ci_low": -0.1, "ci_high": 0.1, "n": 1}
    (compared / "metrics.json").write_text(json.dumps({"scores": {"group_rm": {"difference": gain}}}))
    (group_rm / "metrics.json").write_text(json.dumps({"held_out": {"accuracy": {"value": 0.95}}}))
    arm = _measure("planted", Artifact(path=group_rm, sha256=""), Artifact(path=compared, sha256=""), contexts,
                   DirectorEvalConfig(), 0, 1.0)
    assert (arm.fit_before, arm.fit_after) == (0.75, 0.5)
    assert arm.validity == {"base": 0.5, "director": 1.0}
    assert arm.valid_fit == {"base": 0.5, "director": 0.5}
    assert "valid directives 0.50 -> 1.00, fitting among them 0.500 -> 0.500" in "\n".join(ChainCheck(arms=[arm]).lines())
