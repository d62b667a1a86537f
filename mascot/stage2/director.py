"""The Director's training: GRPO against the group reward model (the paper's method), or DPO (an alternative).

GRPO's prompts are the Director's prompts at the training states (the branch points of the
training contexts' episodes). Each sampled directive is read as written (`read_reply`: invalid
means the flagged fallback, no retry), and it opens a trajectory from its state to the episode's
end (`TrajectoryRollouts`). In `trajectory` mode the policy being trained makes every later
directive of that trajectory: it samples from the adapter as it stands at this optimisation step
(`mascot.train.grpo.PolicySnapshots`), read as written too. Where the base Director's server loads adapters
(`stage2.director` with `load_adapter`, the paper profile's vLLM), each step's snapshot is hot-loaded there as a
LoRA module named by its content hash and the later directives are requested from it
(`mascot.llm.served_adapters.ServedSnapshots`); elsewhere (the tiny profile) the snapshot is merged into a copy of
the base model in this process. In `block` mode the trajectory is one block and the base Director plays the rest
of it. The reward is the group reward model's score of
the whole trajectory (the mean over `rollouts` rollouts), z-scored on the model's training pairs
(`score_scale`: a raw logit's scale differs from one training run to the next), plus a small format
reward, 1 when the sampled directive itself is valid (`TrajectoryReward`): the later directives are
not the completion's tokens. Rollouts are seeded by the state and the draw, not by the directive
(common random numbers: the samples GRPO compares meet the same sampling noise), so the same directive under the same policy leads to the same
trajectories, and they go through the request cache.

The gradient reaches the tokens of the sampled directive only, the first of its trajectory: the
later directives are the same policy's samples, but each is rendered from a fresh prompt (the
conversation so far), so they are not a continuation of the sampled sequence, and TRL's
multi-turn hooks (`rollout_func`, `environment_factory`) train one growing sequence per sample.
The later directives' states are training prompts of their own where they are branch points.

DPO trains on the directive pairs of the training states (`mascot.stage2.trajectories.directive_pairs`).
Each method's adapter has its own folder (`DIRECTORS`), so a run that trained both keeps both.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mascot.artifacts import Artifact
from mascot.config import BackendConfig, DirectorConfig, DirectorDPOConfig, EpisodeConfig, TrainConfig
from mascot.data.contexts import held_out_ids
from mascot.dialogue.directives import CHOICE, director_messages, read_reply
from mascot.dialogue.episodes import Episode
from mascot.dialogue.turns import Turn
from mascot.llm import run_requests, shared_cache
from mascot.llm.served_adapters import ServedSnapshots
from mascot.queries import context_ids
from mascot.stage2.branching import Setting, StoredState, play_trajectory, read_states
from mascot.stage2.trajectories import directive_pairs, trajectory_prompt, trajectory_text
from mascot.train.dpo import train_dpo_policy
from mascot.train.grpo import PolicySnapshots, policy_backend, served_policy, train_grpo_policy
from mascot.train.reward_model import RewardModelScorer, preference_records, score_scale
from mascot.train.runtime import TrainingSetupError, checkpoint_dir, trainer_device

Messages = list[dict[str, str]]

DIRECTORS = {"grpo": "director", "dpo": "director_dpo"}  # method -> stage2/<name>, the adapter's folder


def dpo_policy(train: TrainConfig) -> DirectorConfig:
    """How the DPO Director is sampled: as GRPO's Director samples, from the DPO adapter's base model."""
    return train.director.model_copy(update={"model": train.director_dpo.model,
                                             "chat_template_kwargs": train.director_dpo.chat_template_kwargs})


def _text(completion: Messages | str) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]


def sampled_validity(trajectory: list[Turn]) -> float:
    """1 when the trajectory's first directive, the sampled completion, is valid, else 0. The later directives
    are other samples (in `trajectory` mode the same policy's, rendered from fresh prompts) whose tokens get no
    gradient here, so crediting them would reward this completion for what it did not write."""
    return 0.0 if trajectory[0].fallback else 1.0


def fallback_seed(text: str, draw: int) -> int:
    """The seed of an invalid sampled directive's fallback in a rollout: its own text's and draw's. Drawn from the
    state alone, every invalid directive of a state met the same persona, so being invalid was an action whose
    payoff depended on the state, which GRPO could learn state by state (docs/stage2.md, known-optimum check 2)."""
    return int.from_bytes(hashlib.sha256(f"{draw}\x1f{text}".encode()).digest()[:8], "big")


class TrajectoryRollouts:
    """The trajectories sampled directives open from their states, and the group reward model's scores of them."""

    def __init__(self, setting: Setting, states: list[StoredState], group_rm: Path, device: str):
        self.setting = setting
        self.states = {state.id: state for state in states}
        self.cache = shared_cache(setting.requests)
        self.scorer = RewardModelScorer(group_rm, name="group_rm", device=device)
        # z-scored on the model's training pairs, so that the format reward's weight means the same in every run.
        self.mean, self.sd = score_scale(group_rm)

    def play(self, state_ids: list[str], texts: list[str], draws: int,
             policy: BackendConfig | None = None) -> list[list[list[Turn]]]:
        """Per draw, the trajectory each directive opens from its state, every rollout in flight at once. In
        `trajectory` mode `policy` makes the later directives (the base Director without one)."""
        setting = self.setting
        cast = setting.cast.cast(self.cache, policy if setting.episodes.mode == "trajectory" else None)

        async def one(state: StoredState, text: str, draw: int) -> list[Turn]:
            reply = read_reply(text, setting.roster, state.state, fallback_seed(text, draw))
            # Seeded by the state and the draw, not by the directive: the directives of one state meet the same
            # random numbers, so their rewards differ by what the directives change more than by sampling noise.
            path = f"t{len(state.state)}-rollout" + (f"-{draw}" if draw else "")
            episode = Episode(state.context, setting.cast.profile_for(state.context, setting.seed), setting.seed)
            return await play_trajectory(cast, episode, state.state, setting.episodes, path, first=reply)

        async def all_of_them() -> list[list[Turn]]:
            return list(await asyncio.gather(*(one(self.states[s], t, draw) for draw in range(draws)
                                               for s, t in zip(state_ids, texts, strict=True))))

        played = run_requests(all_of_them())
        return [played[draw * len(texts):(draw + 1) * len(texts)] for draw in range(draws)]

    def score(self, state_ids: list[str], draws: list[list[list[Turn]]]) -> list[list[float]]:
        """The group reward model's score of every draw's trajectory, per directive, z-scored on its training pairs."""
        roster = self.setting.roster
        prompts = [trajectory_prompt(roster, self.states[s].state) for s in state_ids]
        scores = [[(raw - self.mean) / self.sd
                   for raw in self.scorer.score(prompts, [trajectory_text(roster, t) for t in trajectories])]
                  for trajectories in draws]
        return [list(directive) for directive in zip(*scores, strict=True)]

    def terms(self, state_ids: list[str], texts: list[str], draws: int,
              policy: BackendConfig | None = None) -> dict[str, list[float]]:
        """Per directive: the group reward model's mean score over its rollouts, whether the directive itself is
        valid (`format`), and each rollout's score (`group_rm_rollouts`), with draw 0's trajectories."""
        played = self.play(state_ids, texts, draws, policy)
        scores = self.score(state_ids, played)
        return {"group_rm": [statistics.fmean(directive) for directive in scores],
                "format": [sampled_validity(trajectory) for trajectory in played[0]],
                "group_rm_rollouts": scores, "trajectories": played[0]}


class TrajectoryReward:
    """GRPO's reward terms for a batch of sampled directives, from one set of rollouts: TRL calls each term
    as its own reward function (`functions`), so the first call plays the rollouts and the other reads them."""

    def __init__(self, rollouts: TrajectoryRollouts, draws: int, policy: Callable[[], BackendConfig | None]):
        self.rollouts, self.draws, self.policy = rollouts, draws, policy
        self._batch: tuple | None = None
        self._terms: dict[str, list[float]] = {}

    def _term(self, name: str, completions: list[Messages | str], state_id: list[str]) -> list[float]:
        policy = self.policy()
        texts = [_text(c) for c in completions]
        # The same batch under the same policy (this optimisation step's snapshot) is played once.
        batch = (tuple(state_id), tuple(texts), policy.model_dump_json() if policy else None)
        if batch != self._batch:
            self._terms = self.rollouts.terms(state_id, texts, self.draws, policy)
            self._batch = batch
        return self._terms[name]

    @property
    def functions(self) -> list[Callable[..., list[float]]]:
        def term(name: str):
            def function(prompts: list[Messages], completions: list[Messages | str], state_id: list[str],
                         **_: Any) -> list[float]:
                return self._term(name, completions, state_id)

            function.__name__ = name
            return function

        return [term("group_rm"), term("format")]


def credit_until(config: DirectorConfig) -> re.Pattern[str] | None:
    """Where GRPO's loss stops reading a directive under `config.credit`: after its choice, or nowhere (None)."""
    return CHOICE if config.credit == "choice" else None


def split_states(episodes: Artifact, contexts: Artifact) -> tuple[list[StoredState], list[StoredState]]:
    """(training states, held-out states): a state is held out when its context is."""
    held_out = held_out_ids(contexts)
    states = read_states(episodes, contexts)
    return [s for s in states if s.context.id not in held_out], [s for s in states if s.context.id in held_out]


def train_director(config: DirectorConfig, setting: Setting, episodes: Artifact, group_rm: Artifact,
                   out: Path) -> Artifact | None:
    """GRPO on the Director's prompts at the training states, resuming from checkpoints; write the adapter."""
    training, held_out = split_states(episodes, setting.contexts)
    if not training:
        raise TrainingSetupError(f"{episodes.path} has no state of a training context; add contexts "
                                 "(data.corpus.limit) or lower data.held_out_fraction")
    prompts = [{"prompt": director_messages(setting.roster, s.state), "state_id": s.id} for s in training]
    checkpoints = checkpoint_dir(out, config, setting, episodes, group_rm)
    mode = setting.episodes.mode
    snapshots = PolicySnapshots(checkpoints / "policy") if mode == "trajectory" else None
    served = served_policy(config, setting.cast.director) if snapshots else None
    on_server = ServedSnapshots(served, "director") if served else None
    rollouts = TrajectoryRollouts(setting, training, group_rm.verified(), trainer_device(config))

    def policy() -> BackendConfig | None:  # the later directives' Director: this step's snapshot
        if snapshots is None:
            return None
        return on_server.backend(snapshots.current()) if on_server else policy_backend(config, snapshots.current())

    reward = TrajectoryReward(rollouts, config.rollouts, policy)
    weights = [config.reward_weights.group_rm, config.reward_weights.format]
    try:
        return train_grpo_policy(config, prompts, reward.functions, weights, out, checkpoints, name="director",
                                 snapshots=snapshots, credit_until=credit_until(config),
                                 details={"mode": mode, "trajectory_blocks": setting.episodes.trajectory_blocks,
                                          "held_out_states": sorted(s.id for s in held_out)})
    finally:
        if on_server:
            on_server.close()


def train_director_dpo(config: DirectorDPOConfig, pairs: Artifact, contexts: Artifact, episodes: EpisodeConfig,
                       out: Path) -> Artifact | None:
    """DPO on the directive pairs of the training states (the first directives of trajectory pairs from
    episodes played as `episodes` says); write the adapter."""
    frame = directive_pairs(pairs.read_parquet())
    training = frame.filter(~context_ids(frame["query_id"]).is_in(held_out_ids(contexts)))
    if training.is_empty():
        raise TrainingSetupError(f"{pairs.path} has no directive pair of a training state (both first directives "
                                 "valid and different); lower stage2.margin, add branches or contexts")
    return train_dpo_policy(config, preference_records(training), out, checkpoint_dir(out, config, pairs, contexts),
                            name="director_dpo", details={"states": training["query_id"].n_unique(), "mode": episodes.mode,
                                                          "trajectory_blocks": episodes.trajectory_blocks})

