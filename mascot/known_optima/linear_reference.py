"""What a linear reader of the replies' tokens makes of check 3's pairs: a reference for the persona reward model.

When the persona reward model misses `MIN_PAIR_ACCURACY`, either the pairs do not teach the planted judge well
enough, or the model cannot learn what they teach. A linear score fitted to the same training pairs tells the
two apart. Its features are a reply's tokens (the reward model's tokenizer, each token present or not) crossed
with the persona whose prompt it answers, one block of weights per persona, since a word that is one persona's
own is another's fault:

- read from the tokens themselves, it says how far these pairs can teach a reader that sees every token;
- read through a random code of `width` dimensions (the reward model's hidden size, say), it says how far a
  reader gets that keeps every token in that many dimensions without learning which tokens matter.

Both are fitted to the training contexts' pairs by logistic regression on the pair difference (Bradley-Terry, as
the reward model is trained) and scored on the held-out contexts' pairs. Neither sees the lexicons.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mascot.torch_runtime import require_torch

# Adam on the mean logistic loss with a small ridge: the fit converges well within these steps on a few thousand
# pairs, and the ridge keeps weights of tokens seen once from growing without bound.
STEPS, LEARNING_RATE, RIDGE = 400, 0.05, 1e-4


@dataclass(frozen=True)
class Pair:
    persona: str
    chosen: str
    rejected: str


def linear_reference(train: Sequence[Pair], held_out: Sequence[Pair], tokenize: Callable[[str], list[int]],
                     vocabulary: int, width: int | None = None, seed: int = 0) -> float:
    """Held-out pair accuracy (ties count as wrong) of a linear score on the replies' tokens crossed with their
    persona, read from the tokens (`width` None) or through a seeded random code of `width` dimensions."""
    torch = require_torch()
    personas = sorted({pair.persona for pair in [*train, *held_out]})
    generator = torch.Generator().manual_seed(seed)
    code = None if width is None else torch.randn(vocabulary, width, generator=generator) / width ** 0.5

    def features(pairs: Sequence[Pair]):
        present = torch.zeros(2, len(pairs), vocabulary)
        for row, pair in enumerate(pairs):
            present[0, row, tokenize(pair.chosen)] = 1
            present[1, row, tokenize(pair.rejected)] = 1
        difference = present[0] - present[1]
        if code is not None:
            difference = difference @ code
        crossed = torch.zeros(len(pairs), len(personas), difference.shape[1])
        crossed[torch.arange(len(pairs)), [personas.index(pair.persona) for pair in pairs]] = difference
        return crossed.flatten(1)

    x_train, x_held_out = features(train), features(held_out)
    weights = torch.zeros(x_train.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weights], lr=LEARNING_RATE)
    for _ in range(STEPS):
        loss = torch.nn.functional.softplus(-(x_train @ weights)).mean() + RIDGE * weights.square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float((x_held_out @ weights > 0).float().mean()) if held_out else 0.0
