"""The Director's training: GRPO against the group reward model (the paper's method), or DPO (an alternative).

GRPO's prompts are the Director's prompts at the training states (the branch points of the
training contexts' episodes). Each sampled directive is read as written (`read_reply`: invalid
means the flagged fallback, no retry), the persona it names replies through the Speaker, and the
base Director and the Speaker play on to the end of the block (`rollout_turns`). The group reward
model scores that block after the state (`GroupRMReward`, the mean over `rollouts` rollouts); a
small format reward is 1 for a valid directive (`DirectiveFormatReward`). Rollouts are seeded by
the state, the directive's text and the draw, so the same directive always leads to the same
blocks, and they go through the request cache.

DPO trains on the directive pairs of the training states (`mascot.stage2.trajectories.directive_pairs`).
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
from pathlib import Path
from typing import Any

from mascot.artifacts import Artifact
from mascot.config import DirectorConfig, DirectorDPOConfig
from mascot.data.contexts import held_out_ids
from mascot.dialogue.directives import director_messages, read_reply
from mascot.dialogue.episodes import Episode, play
from mascot.dialogue.turns import Turn
from mascot.llm import shared_cache
from mascot.queries import context_ids
from mascot.roster import Roster
from mascot.stage2.branching import CastSpec, StoredState, read_states
from mascot.stage2.trajectories import block_text, directive_pairs, trajectory_prompt
from mascot.train.dpo import train_dpo_policy
from mascot.train.grpo import train_grpo_policy
from mascot.train.reward_model import RewardModelScorer, preference_records
from mascot.train.runtime import TrainingSetupError, checkpoint_dir, trainer_device

Messages = list[dict[str, str]]


def _text(completion: Messages | str) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


class DirectiveFormatReward:
    """1.0 for a valid directive of the roster (parsed and validated as episodes do), else 0.0."""

    __name__ = "format"

    def __init__(self, roster: Roster):
        self.roster = roster

    def __call__(self, prompts: list[Messages], completions: list[Messages | str], **_: Any) -> list[float]:
        return [0.0 if read_reply(_text(c), self.roster, [], None).fallback else 1.0 for c in completions]


class GroupRMReward:
    """The group reward model's score of the block a sampled directive leads to, from its state."""

    __name__ = "group_rm"

    def __init__(self, cast_spec: CastSpec, states: list[StoredState], group_rm: Path, config: DirectorConfig,
                 block_turns: int, run_seed: int, requests: Path | None):
        self.roster = cast_spec.roster
        self.cast = cast_spec.cast(shared_cache(requests) if requests else None)
        self.states = {state.id: state for state in states}
        self.turns = config.rollout_turns or block_turns
        self.draws = config.rollouts
        self.run_seed = run_seed
        self.scorer = RewardModelScorer(group_rm, name="group_rm", device=trainer_device(config))

    def rollouts(self, state_ids: list[str], texts: list[str], draws: int = 1) -> list[list[list[Turn]]]:
        """Per draw, the block each directive leads to from its state; every rollout is in flight at once."""

        async def one(state: StoredState, text: str, draw: int) -> list[Turn]:
            reply = read_reply(text, self.roster, state.state, None)
            # Seeded by the state, the directive's text and the draw: the same directive leads to the same blocks.
            path = "rollout-" + hashlib.sha256(text.encode()).hexdigest()[:16] + (f"-{draw}" if draw else "")
            episode = Episode(state.context, None, self.run_seed)
            return await play(self.cast, episode, state.state, self.turns, path, first=reply)

        async def all_of_them() -> list[list[Turn]]:
            return list(await asyncio.gather(*(one(self.states[s], t, draw) for draw in range(draws)
                                               for s, t in zip(state_ids, texts, strict=True))))

        blocks = asyncio.run(all_of_them())
        return [blocks[draw * len(texts):(draw + 1) * len(texts)] for draw in range(draws)]

    def score(self, state_ids: list[str], draws: list[list[list[Turn]]]) -> list[list[float]]:
        """The group reward model's score of every draw's block, per directive."""
        prompts = [trajectory_prompt(self.roster, self.states[s].state) for s in state_ids]
        scores = [self.scorer.score(prompts, [block_text(self.roster, block) for block in blocks]) for blocks in draws]
        return [list(directive) for directive in zip(*scores, strict=True)]

    def __call__(self, prompts: list[Messages], completions: list[Messages | str], state_id: list[str],
                 **_: Any) -> list[float]:
        texts = [_text(c) for c in completions]
        return [statistics.fmean(scores) for scores in self.score(state_id, self.rollouts(state_id, texts, self.draws))]


def director_rewards(config: DirectorConfig, cast_spec: CastSpec, states: list[StoredState], group_rm: Path,
                     block_turns: int, run_seed: int, requests: Path | None) -> tuple[list, list[float]]:
    """The reward functions and their weights."""
    functions = [GroupRMReward(cast_spec, states, group_rm, config, block_turns, run_seed, requests),
                 DirectiveFormatReward(cast_spec.roster)]
    return functions, [config.reward_weights.group_rm, config.reward_weights.format]


def split_states(episodes: Artifact, contexts: Artifact) -> tuple[list[StoredState], list[StoredState]]:
    """(training states, held-out states): a state is held out when its context is."""
    held_out = held_out_ids(contexts)
    states = read_states(episodes, contexts)
    return [s for s in states if s.context.id not in held_out], [s for s in states if s.context.id in held_out]


def train_director(config: DirectorConfig, cast_spec: CastSpec, block_turns: int, run_seed: int, episodes: Artifact,
                   contexts: Artifact, group_rm: Artifact, requests: Path, out: Path) -> Artifact:
    """GRPO on the Director's prompts at the training states, resuming from checkpoints; write the adapter."""
    training, held_out = split_states(episodes, contexts)
    if not training:
        raise TrainingSetupError(f"{episodes.path} has no state of a training context; add contexts "
                                 "(data.corpus.limit) or lower data.held_out_fraction")
    prompts = [{"prompt": director_messages(cast_spec.roster, s.state), "state_id": s.id} for s in training]
    rewards, weights = director_rewards(config, cast_spec, training, group_rm.verified(), block_turns, run_seed,
                                        requests)
    return train_grpo_policy(config, prompts, rewards, weights, out,
                             checkpoint_dir(out, config, cast_spec, episodes, group_rm), name="director",
                             details={"held_out_states": sorted(s.id for s in held_out)})


def train_director_dpo(config: DirectorDPOConfig, pairs: Artifact, contexts: Artifact, out: Path) -> Artifact:
    """DPO on the directive pairs of the training states; write the adapter."""
    frame = directive_pairs(pairs.read_parquet())
    training = frame.filter(~context_ids(frame["query_id"]).is_in(held_out_ids(contexts)))
    if training.is_empty():
        raise TrainingSetupError(f"{pairs.path} has no directive pair of a training state (both first directives "
                                 "valid and different); lower stage2.margin, add branches or contexts")
    return train_dpo_policy(config, preference_records(training), out, checkpoint_dir(out, config, pairs, contexts),
                            name="director_dpo", details={"states": training["query_id"].n_unique()})

