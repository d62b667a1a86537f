"""Known-optimum checks at the CI budget: the project's trainers against planted rewards, with two controls.

`python benchmarks/learning.py` runs the same checks at their full budget and prints their figures.
"""

from __future__ import annotations

import pytest

from mascot.known_optima.director_grpo import check_policy, run_director_check
from mascot.known_optima.stage2_chain import check_director, run_chain_check
from mascot.roster import load_roster
from mascot.train.tiny import resolve_tiny_models

pytestmark = pytest.mark.integration

DIRECTOR_STEPS, DIRECTOR_SAMPLES = 30, 16
CHAIN_STEPS, CHAIN_SAMPLES = 30, 8


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


def test_stage2_learns_which_persona_fits_a_cue_from_a_planted_group_judge_and_its_controls_do_not(
        tiny_models, tiny_config, tmp_path):
    """Check 2: episodes, the planted group judge, pairs, the group RM and the GRPO Director, as Stage 2 runs them.
    The group RM ranks held-out pairs (new cue phrasings) at >= 90%, the trained Director names the persona that fits
    the cue more often on held-out contexts and gains on the group RM, its choice differs between cue classes; under
    the flipped judge the fitting share falls, under the shuffled judge it stays."""
    profile = resolve_tiny_models(tiny_config, progress=False)  # the tiny_models fixture's build
    check = run_chain_check(profile, check_director(profile, CHAIN_STEPS), tmp_path,
                            samples_per_prompt=CHAIN_SAMPLES)
    report = "\n".join(check.lines())
    assert [arm.arm for arm in check.arms] == ["planted", "flipped", "shuffled"]
    assert check.passed, report
