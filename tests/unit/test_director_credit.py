"""`benchmarks/director_credit.py`: its reward reads the named persona, and its `choice` arm's loss reads only the
completion's first tokens, for the training it wraps and no longer."""

from __future__ import annotations

import torch
from benchmark_scripts import load_benchmark
from trl import GRPOTrainer

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
    with credit.loss_on_first_tokens(None):
        assert "tool_mask" not in GRPOTrainer._generate_and_score_completions(None, None)
    with credit.loss_on_first_tokens(2):
        masked = GRPOTrainer._generate_and_score_completions(None, None)
    assert masked["tool_mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert masked["num_items_in_batch"].item() == 4  # the loss is averaged over the tokens it reads
    assert GRPOTrainer._generate_and_score_completions is batch
