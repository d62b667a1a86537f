"""`train.director.credit: choice`: GRPO's loss reads each directive up to the end of its choice, and a directive that
names nobody whole; and TRL still reads the mask and the normaliser this trainer writes (its private batch)."""

from __future__ import annotations

import inspect

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from trl import GRPOTrainer

from mascot.dialogue.directives import CHOICE
from mascot.train.choice_credit import choice_credit_trainer, choice_mask, tokens_until

VALID = '{"next_speaker": "anchor", "instruction": "Listen first, then ask one short question."}'
NOBODY = '{"instruction": "Listen first."}'
CUT = '{"next_speaker": "anc'


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on directives, so that tokens span several characters and a token may end past the
    choice's closing quote, as the tiny tokenizer's do."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    model.train_from_iterator([VALID, NOBODY, '{"next_speaker": "beacon", "instruction": "Share it."}'] * 20,
                              trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=model)


def decode_with(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def test_the_choice_ends_at_the_first_token_that_closes_the_next_speakers_value(tokenizer):
    decode, ids = decode_with(tokenizer), tokenizer.encode(VALID)
    count = tokens_until(ids, decode, CHOICE)
    assert CHOICE.search(decode(ids[:count])) and not CHOICE.search(decode(ids[:count - 1]))
    assert decode(ids[:count]).startswith('{"next_speaker": "anchor"') and "instruction" not in decode(ids[:count])
    assert count < len(ids) / 2  # the instruction, most of the directive, is not read


@pytest.mark.parametrize("text", [NOBODY, CUT])
def test_a_directive_that_names_nobody_is_read_whole(tokenizer, text):
    ids = tokenizer.encode(text)
    assert tokens_until(ids, decode_with(tokenizer), CHOICE) == len(ids)


def right_padded(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer.encode(text) for text in texts]
    width = max(map(len, rows)) + 2
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    return ids, torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])


def test_the_mask_reads_each_row_as_far_as_its_completion_mask_and_its_choice(tokenizer):
    ids, completion = right_padded(tokenizer, [VALID, NOBODY])
    mask = choice_mask(ids, completion, decode_with(tokenizer), CHOICE)
    choice = tokens_until(tokenizer.encode(VALID), decode_with(tokenizer), CHOICE)
    assert mask[0].tolist() == [1] * choice + [0] * (ids.shape[1] - choice)
    assert mask[1].tolist() == completion[1].tolist()  # names nobody: read whole, the padding not at all


def test_the_trainer_hands_trl_the_mask_and_the_loss_normaliser_over_the_tokens_it_reads(tokenizer, monkeypatch):
    from accelerate import Accelerator

    ids, completion = right_padded(tokenizer, [VALID, NOBODY])
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions",  # TRL's batch, as far as the masks go
                        lambda self, inputs: {"completion_ids": ids, "completion_mask": completion,
                                              "num_items_in_batch": completion.sum()})
    trainer_class = choice_credit_trainer()
    trainer = trainer_class.__new__(trainer_class)
    trainer.processing_class, trainer.choice, trainer.accelerator = tokenizer, CHOICE, Accelerator(cpu=True)
    batch = trainer._generate_and_score_completions([])
    choice = tokens_until(tokenizer.encode(VALID), decode_with(tokenizer), CHOICE)
    assert batch["tool_mask"].sum(1).tolist() == [choice, completion[1].sum().item()]
    assert batch["num_items_in_batch"].item() == choice + completion[1].sum().item()


def test_trl_multiplies_the_tool_mask_into_the_loss_and_normalises_it_by_the_items_in_the_batch():
    """The private contract the trainer relies on (TRL 1.16): a TRL that stops reading either breaks it silently."""
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]' in loss
    assert 'inputs["num_items_in_batch"]' in loss
    assert "(per_token_loss * mask).sum()" in loss
    assert "num_items_in_batch" in inspect.getsource(GRPOTrainer._generate_and_score_completions)
