"""Known-optimum checks: small worlds whose best behaviour is known by construction, each run through the
project's own trainer, with two controls.

A check plants a reward, trains with it, and measures on held-out prompts whether the policy moved
towards the planted optimum, with an interval. Its controls train the same way with the reward's sign
flipped (the policy must move the other way) and with the rewards shuffled across completions (the
policy must stay where it was). A trainer that passes all three arms turns a reward into the behaviour
it pays for; one that fails them cannot be trusted with a reward model whose optimum nobody knows.

The tests run each check at a reduced budget (tests/integration/test_known_optima.py); `python
benchmarks/learning.py` runs them at their full budget and prints the figures.

- `director_grpo`: check 1, the Director's GRPO alone (`mascot.train.grpo.train_grpo_policy`).
- `stage2_chain`: check 2, the whole Stage 2 chain, against a planted group judge.
- `speaker_persona`: check 3, the persona reward model (`mascot.train.reward_model.train_reward_model`) and the
  Speaker's GRPO, on Stage 1's world judged by a planted persona judge.
"""

EXPECTED = {"planted": "rise", "flipped": "fall", "shuffled": "stay"}  # what each arm's policy must do


def moved_as_expected(difference: dict, expected: str) -> bool:
    """Whether a paired difference's interval (`mascot.stats.paired_difference`) shows the move an arm must make:
    above 0 to rise, below 0 to fall, containing 0 to stay."""
    low, high = difference["ci_low"], difference["ci_high"]
    return {"rise": low > 0, "fall": high < 0, "stay": low <= 0 <= high}[expected]
