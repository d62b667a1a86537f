"""Reproducible, seeded subsampling of contexts.

Each context gets a rank: the SHA-256 of `"<seed>:<context id>"`. The `limit` lowest-ranked contexts
are kept. This depends only on the seed and the ids, never on Python's per-process hash
randomisation, the file order or the platform, so:

- the same seed always keeps the same contexts;
- a larger limit keeps a superset of a smaller one (same seed), which lets a run grow without
  changing the contexts it already paid for;
- a different seed keeps a different selection.

The kept contexts are returned in their original corpus order, so consecutive meeting windows stay
consecutive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from mascot.data.context import Context


def sampling_rank(seed: int, context_id: str) -> str:
    """A stable pseudo-random rank for one context id under one seed (hex digest; compare as strings)."""
    return hashlib.sha256(f"{seed}:{context_id}".encode()).hexdigest()


def subsample(contexts: Sequence[Context], limit: int | None, seed: int = 0) -> list[Context]:
    """Keep `limit` contexts chosen by seeded rank; all of them when `limit` is None or too large."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    ensure_unique_ids(contexts)
    if limit is None or limit >= len(contexts):
        return list(contexts)
    ranked = sorted(range(len(contexts)), key=lambda i: sampling_rank(seed, contexts[i].id))
    kept = sorted(ranked[:limit])
    return [contexts[i] for i in kept]


def ensure_unique_ids(contexts: Sequence[Context]) -> None:
    """Raise if two contexts share an id: ids key caches and artifacts, so a clash would merge rows."""
    seen: set[str] = set()
    for context in contexts:
        if context.id in seen:
            raise ValueError(f"duplicate context id {context.id!r}; ids must be unique within a load")
        seen.add(context.id)
