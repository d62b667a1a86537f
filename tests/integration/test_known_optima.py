"""Known-optimum checks at the CI budget: the project's trainers against planted rewards, with two controls.

`python benchmarks/learning.py` runs the same checks at their full budget and prints their figures.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mascot.config import RewardModelConfig
from mascot.known_optima.director_grpo import check_policy, run_director_check
from mascot.known_optima.speaker_persona import (
    PersonaRMCheck,
    SpeakerWorld,
    build_speaker_world,
    check_persona_rm,
    check_reward_model,
    check_speaker,
    run_speaker_check,
)
from mascot.known_optima.stage2_chain import check_director, run_chain_check
from mascot.roster import load_roster
from mascot.train.tiny import resolve_tiny_models

pytestmark = pytest.mark.integration

DIRECTOR_STEPS, DIRECTOR_SAMPLES = 15, 16
CHAIN_STEPS, CHAIN_SAMPLES = 30, 8
SPEAKER_STEPS, SPEAKER_SAMPLES, RM_EPOCHS = 20, 8, 2


def test_director_grpo_moves_towards_a_planted_optimum_and_its_controls_do_not(tiny_models, tiny_config, tmp_path):
    """Check 1: the target's held-out share rises under the planted reward, falls under its sign flip, and
    stays under rewards shuffled across completions, each with a 95% interval over held-out prompts."""
    policy = check_policy(tiny_config.train.director, tiny_models.lm, DIRECTOR_STEPS)
    check = run_director_check(policy, load_roster(tiny_config.data.roster), tmp_path,
                               samples_per_prompt=DIRECTOR_SAMPLES, seed=0)
    report = "\n".join(check.lines())
    assert [arm.arm for arm in check.arms] == ["planted", "flipped", "shuffled"]
    assert 0.15 <= check.base_shares[check.target] <= 0.5, report
    assert check.passed, report


# On the tiny models the Director does not yet learn a choice conditioned on the message within the chain: the group
# RM ranks 97% (planted) and 96% (flipped) of held-out pairs, yet at 30 steps the fitting share moves by +0.003
# [-0.045, +0.056] and +0.007 [-0.049, +0.052], at 90 steps by +0.042 [-0.024, +0.101] and +0.017 [-0.024, +0.073]
# (2026-12-06, the tiny build of docs/models.md; docs/stage2.md). Not the budget, nor the warm start's flat choice:
# rewarded directly for naming the fitting persona, after 1,920 completions, the Director names it in 0.38 of its
# valid held-out directives where it began at 0.34; trained by supervision on the same prompts, in 0.65 of them.
# GRPO spreads the advantage over the whole directive, whose sampled instruction drowns the one token of the choice:
# with the loss on the choice's tokens alone, the direct learner reached 0.44 (benchmarks/director_credit.py). That loss
# and a temperature of 0.7 are now the profile's (train.director.credit: choice); at 60 steps of 64, sixteen times
# this test's completions, the planted judge raised the fitting share and the flipped one lowered it in three runs of
# three, with all three arms' intervals clear in one of them (docs/stage2.md).
# strict: once the tiny world lets it pass, the mark must go.
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="issue 33: at this budget the tiny Director's move "
                   "is within its interval (docs/stage2.md, known-optimum check 2)")
def test_stage2_learns_which_persona_fits_a_cue_from_a_planted_group_judge_and_its_controls_do_not(
        tiny_models, tiny_config, tmp_path):
    """Check 2: episodes, the planted group judge, pairs, the group RM and the GRPO Director, as Stage 2 runs them.
    The group RM ranks held-out pairs (cues in new sentences) at >= 90%, the trained Director names the persona that fits
    the cue more often on held-out contexts and gains on the group RM, its choice differs between cue classes; under
    the flipped judge the fitting share falls, under the shuffled judge it stays."""
    profile = resolve_tiny_models(tiny_config, progress=False)  # the tiny_models fixture's build
    director = check_director(profile, CHAIN_STEPS)
    # The planted arm first: where it fails, the controls cannot make the check pass, and they would cost two more
    # group RMs and Directors. The second call plays the same episodes again, from the first one's request cache.
    for arms in (("planted",), ("flipped", "shuffled")):
        check = run_chain_check(profile, director, tmp_path, samples_per_prompt=CHAIN_SAMPLES, arms=arms)
        report = "\n".join(check.lines())
        print(report)
        assert [arm.arm for arm in check.arms] == list(arms)
        assert check.passed, report


@dataclass(frozen=True)
class PersonaRM:
    world: SpeakerWorld
    config: RewardModelConfig
    check: PersonaRMCheck


@pytest.fixture(scope="module")
def persona_rm(tiny_models, tiny_config, tmp_path_factory) -> PersonaRM:
    """Check 3's world, judged by the planted persona judge, and the persona reward model trained on its pairs."""
    out = tmp_path_factory.mktemp("speaker-world")
    roster = load_roster(tiny_config.data.roster)
    generation = tiny_config.generation.model_copy(update={"model": str(tiny_models.lm)})
    world = build_speaker_world(tiny_config.data, tiny_config.stage1, generation, roster, out / "world")
    config = check_reward_model(tiny_config.train.persona_rm, tiny_models.rm, epochs=RM_EPOCHS)
    return PersonaRM(world, config, check_persona_rm(world, config, out / "persona_rm"))


def test_the_persona_rm_learns_a_planted_persona_vocabulary_and_reads_the_persona(persona_rm):
    """Check 3, the reward model: on Stage 1's world judged by a planted persona judge, it ranks 90% of held-out
    pairs and wins 80% of persona swaps (one reply under its own persona's prompt and under another's)."""
    check = persona_rm.check
    report = "\n".join(check.lines())
    print(report)
    assert check.pair_accuracy_passed, report
    assert check.swap_passed and check.swap["accuracy"]["n"] >= 20, report


# At the CI budget the Speaker's GRPO does not yet move the table: rewarded by the persona RM above, with the check's
# settings, the planted arm's diagonal minus off-diagonal moved by +0.023 [-0.096, +0.125] after 20 steps (2026-12-07);
# benchmarks/learning.py's 60 steps move it (docs/stage1.md). strict: once the check passes at this budget, the mark
# must go.
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="issue 33: at 20 steps the tiny Speaker's GRPO does not move the "
                   "persona x vocabulary table (docs/stage1.md, known-optimum check 3)")
def test_speaker_grpo_moves_towards_its_personas_vocabulary_and_its_controls_do_not(persona_rm, tiny_models,
                                                                                      tiny_config, tmp_path):
    """Check 3, the Speaker: its GRPO against the persona reward model moves the held-out persona x vocabulary table
    towards its diagonal, the sign flip away from it, and shuffled rewards leave it, each with a 95% interval over
    held-out contexts. The reward model must have passed: a Speaker rewarded by one that missed its persona proves
    nothing."""
    assert persona_rm.check.passed, "\n".join(persona_rm.check.lines())
    policy = check_speaker(tiny_config.train.speaker, tiny_models.lm, SPEAKER_STEPS)
    # The planted arm first: where it fails, the controls cannot make the check pass.
    for arms in (("planted",), ("flipped", "shuffled")):
        check = run_speaker_check(persona_rm.world, persona_rm.check, policy, tmp_path / "speaker",
                                  samples_per_prompt=SPEAKER_SAMPLES, arms=arms,
                                  chat_template_kwargs=persona_rm.config.chat_template_kwargs)
        report = "\n".join(check.lines())
        print(report)
        assert [arm.arm for arm in check.arms] == list(arms)
        assert check.passed, report
