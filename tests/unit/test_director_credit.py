"""`benchmarks/director_credit.py`: its reward reads the named persona, and its temperature option reaches the
policy (its `choice` arm's loss: tests/unit/test_choice_credit.py)."""

from __future__ import annotations

from benchmark_scripts import load_benchmark

credit = load_benchmark("director_credit")


def test_the_reward_reads_the_named_persona_whether_or_not_the_directive_is_valid():
    reward = credit.CueReward({"p1": "anchor", "p2": "beacon"})
    completions = ['{"next_speaker": "anchor", "instruction": "Listen."}',  # valid, fits
                   '{"next_speaker": "anchor", "instruc',  # cut short, names the fitting persona
                   '{"next_speaker": "catalyst", "instruction": "Plan."}',  # valid, does not fit
                   'anchor beacon']  # names nobody as next_speaker
    assert reward([], completions, prompt_id=["p1", "p1", "p2", "p2"]) == [1.0, 1.0, 0.0, 0.0]


def test_the_temperature_option_samples_the_director_at_it_and_defaults_to_the_profiles():
    from argparse import Namespace

    from mascot.config import load_config

    profile = load_config(credit.REPO / "configs" / "tiny.yaml")
    args = Namespace(steps=3, batch_size=8, generations=4, temperature=None)
    assert credit.director_policy(profile, args).temperature == profile.train.director.temperature
    args.temperature = 0.7
    policy = credit.director_policy(profile, args)
    assert (policy.temperature, policy.batch_size, policy.num_generations, policy.max_steps) == (0.7, 8, 4, 3)
