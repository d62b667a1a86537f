"""GRPO whose loss reads only the part of each completion that makes its choice (`train.director.credit: choice`).

GRPO gives a completion's advantage to every one of its tokens. A directive names its persona in its first
tokens and then writes an instruction; on the tiny models the instruction's tokens, sampled with much entropy,
take the credit of the one token that names the persona, and the Director does not learn whom to choose
(docs/stage2.md, known-optimum check 2). The trainer of `choice_credit_trainer()` puts the loss (and its KL
term) on each completion's tokens up to the end of the first match of a pattern, `"next_speaker": "<persona>"`
for the Director; a completion without a match (it names nobody) is trained whole, so the format's reward still
reaches what it wrote. The rollouts are still sampled, played and rewarded whole.

It reads TRL 1.16's private batch: `tool_mask`, the mask TRL multiplies into the loss for a tool's tokens, and
`num_items_in_batch`, the loss's normaliser. tests/unit/test_choice_credit.py fails if either changes meaning.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any


def tokens_until(ids: list[int], decode: Callable[[list[int]], str], pattern: re.Pattern[str]) -> int:
    """How many of `ids` it takes to write `pattern`'s first match in full: the fewest whose decoded text holds a
    match (a longer prefix holds it too, so a binary search finds them); all of them where none does."""
    if not pattern.search(decode(ids)):
        return len(ids)
    low, high = 1, len(ids)
    while low < high:
        middle = (low + high) // 2
        if pattern.search(decode(ids[:middle])):
            high = middle
        else:
            low = middle + 1
    return low


def choice_mask(completion_ids: Any, completion_mask: Any, decode: Callable[[list[int]], str],
                pattern: re.Pattern[str]) -> Any:
    """1 on each completion's tokens up to the end of its choice (`tokens_until`), 0 after: a row of
    `completion_ids` (a tensor), right-padded, is read as far as `completion_mask` says."""
    import torch

    mask = torch.zeros_like(completion_mask)
    for row, (ids, length) in enumerate(zip(completion_ids.tolist(), completion_mask.sum(1).tolist(), strict=True)):
        mask[row, :tokens_until(ids[:length], decode, pattern)] = 1
    return mask


@functools.cache
def choice_credit_trainer() -> type:
    """`ChoiceCreditGRPOTrainer`, TRL's GRPOTrainer with its loss on each completion's tokens up to the end of
    `choice`'s first match. Built on first use: importing TRL loads torch and wandb, which a module of the library
    does only when it trains (mascot.torch_runtime)."""
    from trl import GRPOTrainer

    class ChoiceCreditGRPOTrainer(GRPOTrainer):
        def __init__(self, *args: Any, choice: re.Pattern[str], **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.choice = choice

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            batch = super()._generate_and_score_completions(inputs)
            completion_mask = batch["completion_mask"]

            def decode(ids: list[int]) -> str:  # as TRL decodes the completions its reward functions read
                return self.processing_class.decode(ids, skip_special_tokens=True)

            mask = choice_mask(batch["completion_ids"], completion_mask, decode, self.choice)
            batch["tool_mask"] = mask if "tool_mask" not in batch else batch["tool_mask"] * mask
            # TRL's normaliser: the tokens the loss reads, over every process (as TRL counts them for tools' tokens).
            batch["num_items_in_batch"] = self.accelerator.gather((completion_mask * batch["tool_mask"]).sum()).sum()
            return batch

    return ChoiceCreditGRPOTrainer
