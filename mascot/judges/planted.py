"""The planted group judge: a judge whose best Director is known by construction. It is NOT a quality judge.

It reads a cue class from the context's metadata (`cue`), which the world that made the context put
there, and the persona that fits it from its config (`prefer`). A trajectory scores the rubric's top
on every criterion when its first companion turn is by that persona, and its bottom otherwise. So the
only thing a Director can do to raise the score is to name the persona that fits the cue in the user's
last message, and a Stage 2 that works must learn exactly that (`mascot.known_optima.stage2_chain`).

Two controls keep the same machinery and cut the signal: `flipped` scores the opposite (the chain must
learn to avoid the fitting persona), `shuffled` scores by a coin seeded by the item's id, with the same
base rate as the fit itself, so its scores say nothing about the trajectory they reach.
"""

from __future__ import annotations

import hashlib

from mascot.judges.base import Judgment
from mascot.judges.group import BlockItem
from mascot.rubrics import Rubric

CONTROLS = (None, "flipped", "shuffled")


class PlantedGroupJudge:
    """Scores a block by whether its first companion is the persona `prefer` names for the context's cue."""

    kind = "planted"

    def __init__(self, rubric: Rubric, prefer: dict[str, str], name: str = "planted", control: str | None = None):
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {CONTROLS}, got {control!r}")
        self.rubric, self.prefer, self.name, self.control = rubric, prefer, name, control

    def fits(self, item: BlockItem) -> bool | None:
        """Whether the block's first companion fits the context's cue; None when the context has no cue."""
        cue = item.context.metadata.get("cue")
        if cue not in self.prefer:
            return None
        first = next((turn.speaker for turn in item.block if turn.role == "companion"), None)
        return first == self.prefer[cue]

    def _coin(self, item: BlockItem) -> bool:
        """True with the chance that a persona drawn at random fits: the fit's base rate, from the item's id alone."""
        digest = hashlib.sha256(f"{item.query_id}\x1f{item.candidate_idx}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % len(item.roster.active) == 0

    async def judge(self, item: BlockItem, seed: int) -> Judgment:
        fits = self.fits(item)
        if fits is None:
            return Judgment.failed(item, self.name, f"context {item.context.id} has no cue in {sorted(self.prefer)}",
                                  attempts=1)
        high = {None: fits, "flipped": not fits, "shuffled": self._coin(item)}[self.control]
        score = self.rubric.scale_max if high else self.rubric.scale_min
        return Judgment.succeeded(item, self.name, {cid: score for cid in self.rubric.criterion_ids},
                                  f"Planted judge (not a quality judge, control {self.control}): the first companion "
                                  f"{'fits' if fits else 'does not fit'} the cue.")
