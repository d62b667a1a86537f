"""GRPO's loss on each completion's first tokens only: where the Director's credit goes, measured.

GRPO gives a completion's advantage to every one of its tokens. A directive names its persona in its first
tokens and then samples an instruction; on the tiny models the instruction's tokens take the credit of the
choice (docs/stage2.md, known-optimum check 2). `loss_on_first_tokens(count)` trains on the first `count`
tokens alone, the rollouts still sampled and rewarded whole, so a benchmark can compare the two on the same
samples (`benchmarks/director_credit.py`, `benchmarks/learning.py --choice-tokens`). It patches TRL's private
batch builder for the duration of a block: an instrument for the benchmarks, not a setting of the trainers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def loss_on_first_tokens(count: int | None) -> Iterator[None]:
    """With a count, TRL's GRPO loss (and its KL term) reads only each completion's first `count` tokens: its
    `tool_mask` is the mask it multiplies into the loss. None leaves the trainer as it is."""
    if count is None:
        yield
        return
    import torch
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_and_score_completions

    def masked(self, inputs):
        batch = original(self, inputs)
        completion = batch["completion_mask"]
        first = (torch.arange(completion.shape[1], device=completion.device) < count).int()
        batch["tool_mask"] = first.unsqueeze(0).expand_as(completion).contiguous()
        batch["num_items_in_batch"] = (completion * batch["tool_mask"]).sum()  # the loss's normaliser
        return batch

    GRPOTrainer._generate_and_score_completions = masked
    try:
        yield
    finally:
        GRPOTrainer._generate_and_score_completions = original
