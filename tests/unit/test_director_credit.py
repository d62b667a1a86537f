"""`benchmarks/director_credit.py`: its reward reads the named persona, its temperature option reaches the policy, and
its `choice` arm's loss (`mascot.known_optima.choice_credit`) reads only the completion's first tokens, for the training
it wraps and no longer."""

from __future__ import annotations

import torch
from benchmark_scripts import load_benchmark
from trl import GRPOTrainer

from mascot.known_optima.choice_credit import loss_on_first_tokens

credit = load_benchmark("director_credit")


def test_the_reward_reads_the_named_persona_whether_or_not_the_directive_is_valid():
    reward = credit.CueReward({"p1": "anchor", "p2": "beacon"})
    completions = ['{"next_speaker": "anchor", "instruction": "Listen."}',  # valid, fits
                   '{"next_speaker": "anchor", "instruc',  # cut short, names the fitting persona
                   '{"next_speaker": "catalyst", "instruction": "Plan."}',  # valid, does not fit
                   'anchor beacon']  # names nobody as next_speaker
    assert reward([], completions, prompt_id=["p1", "p1", "p2", "p2"]) == [1.0, 1.0, 0.0, 0.0]


def test_the_choice_arm_masks_the_loss_after_the_first_tokens_and_only_while_it_trains(monkeypatch):
    completion_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])

    def batch(self, inputs):  # TRL's batch builder, as far as the mask goes
        return {"completion_mask": completion_mask, "num_items_in_batch": completion_mask.sum()}

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", batch)
    with loss_on_first_tokens(None):
        assert "tool_mask" not in GRPOTrainer._generate_and_score_completions(None, None)
    with loss_on_first_tokens(2):
        masked = GRPOTrainer._generate_and_score_completions(None, None)
    assert masked["tool_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert masked["num_items_in_batch"].item() == 4  # the loss is averaged over the tokens it reads
    assert GRPOTrainer._generate_and_score_completions is batch


def test_the_temperature_option_samples_the_director_at_it_and_defaults_to_the_profiles():
    from argparse import Namespace

    from mascot.config import load_config

    profile = load_config(credit.REPO / "configs" / "tiny.yaml")
    args = Namespace(steps=3, batch_size=8, generations=4, temperature=None)
    assert credit.director_policy(profile, args).temperature == profile.train.director.temperature
    args.temperature = 0.7
    policy = credit.director_policy(profile, args)
    assert (policy.temperature, policy.batch_size, policy.num_generations, policy.max_steps) == (0.7, 8, 4, 3)
