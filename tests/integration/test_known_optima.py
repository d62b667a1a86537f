"""Known-optimum checks at the CI budget: the project's trainers against planted rewards, with two controls.

`python benchmarks/learning.py` runs the same checks at their full budget and prints their figures.
"""

from __future__ import annotations

import pytest

from mascot.known_optima.director_grpo import check_policy, run_director_check
from mascot.roster import load_roster

pytestmark = pytest.mark.integration

DIRECTOR_STEPS, DIRECTOR_SAMPLES = 30, 16


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
