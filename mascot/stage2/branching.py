"""The branching episode generator: an episode's main line, its branch points (states), and M
trajectories from each state.

For every context, an episode plays its main line once: `prefix_blocks` blocks, then one more
block per further branch point, each block followed by the simulated user's turn. Its states are
the points after `prefix_blocks`, `prefix_blocks + 1`, ... blocks (`episodes.states` of them). From
each state, M branches each ask the Director for a directive with their own seed and play a
trajectory to the episode's end: `trajectory_blocks` blocks of N turns, each followed by the
user's turn (`mode: trajectory`), or one block without it (`mode: block`). Every branch continues
the very same turns, so the branches share the main line byte for byte and by request: no request
of the main line is made twice. The trajectories are what the group judge scores; pairs of them
feed the group reward model, and pairs of their first directives feed DPO.

episodes.parquet holds one row per turn: the main line's rows have a null `branch` and `state_id`,
each trajectory's rows its state and branch index. A state's id is `<context id>|t<turn count>`, so
tables keyed by state join with contexts.parquet like Stage 1's query ids do
(`mascot.queries.context_ids`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.artifacts import Artifact, write_parquet
from mascot.config import BackendConfig, EpisodeConfig
from mascot.data.context import Context
from mascot.data.contexts import read_contexts
from mascot.dialogue.directives import DirectorReply
from mascot.dialogue.episodes import Cast, Episode, choose_profile, play, row_turn, turn_row
from mascot.dialogue.turns import Turn, opening_turns
from mascot.llm import RequestCache, make_backend, request_batch, run_requests, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.roster import Roster, UserProfile

EPISODE_SCHEMA = {
    "episode_id": pl.String, "context_id": pl.String, "state_id": pl.String, "user_profile": pl.String,
    "branch": pl.Int64, "block": pl.Int64, "turn_idx": pl.Int64, "role": pl.String, "speaker": pl.String,
    "text": pl.String, "seed": pl.Int64, "directive": pl.String, "director_seed": pl.Int64,
    "directive_attempts": pl.Int64, "fallback": pl.Boolean,
}


class CastSpec(BaseModel):
    """The cast of Stage 2 as a value (a step's input and cache key): the roster, the backends of the
    Director, the Speaker and the simulated user, and the user profiles of the domain."""

    model_config = ConfigDict(frozen=True)

    roster: Roster
    director: BackendConfig
    speaker: BackendConfig
    user: BackendConfig
    profiles: list[UserProfile]
    max_directive_attempts: int = 3

    def cast(self, cache: RequestCache | None, director: BackendConfig | None = None) -> Cast:
        """The roles' backends. `director` replaces the configured Director with a policy (a trained one, say),
        whose replies are read as written, with no retry, as GRPO reads its samples."""
        attempts = self.max_directive_attempts if director is None else 1
        director = director or self.director
        return Cast(self.roster, make_backend(director, cache=cache), make_backend(self.speaker, cache=cache),
                    make_backend(self.user, cache=cache), director.params, self.speaker.params, self.user.params,
                    attempts)

    def profile_for(self, context: Context, run_seed: int) -> UserProfile | None:
        """The episode's simulated user: one of the domain's profiles, chosen by seed, or none."""
        return choose_profile(self.profiles, context, run_seed)


class Setting(BaseModel):
    """What the steps that play episodes share: the cast, how episodes run, the run seed, the contexts and
    the request cache. A step's input and cache key (the contexts artifact's hash makes it one)."""

    model_config = ConfigDict(frozen=True)

    cast: CastSpec
    episodes: EpisodeConfig
    seed: int
    contexts: Artifact
    requests: Path

    @property
    def roster(self) -> Roster:
        return self.cast.roster


@dataclass(frozen=True)
class BranchPoint:
    turns: int  # of the main line before the state
    trajectories: list[list[Turn]]


@dataclass(frozen=True)
class Branched:
    episode: Episode
    line: list[Turn]  # the main line after the opening, played once
    points: list[BranchPoint]


def state_id(context_id: str, turns: int) -> str:
    return f"{context_id}|t{turns}"


async def play_trajectory(cast: Cast, episode: Episode, state: list[Turn], config: EpisodeConfig, path: str, *,
                          first: DirectorReply | None = None) -> list[Turn]:
    """A trajectory from `state` to the episode's end (the first directive `first`, when given)."""
    played: list[Turn] = []
    for block in range(config.trajectory_blocks):
        played += await play(cast, episode, [*state, *played], config.block_turns, path,
                             user_after=config.trajectory_user_turns, first=first if block == 0 else None)
    return played


async def branch_episode(cast: Cast, episode: Episode, config: EpisodeConfig) -> Branched:
    """Play the main line once, then every state's branches from it: all branches of all states at once."""
    opening, line = opening_turns(episode.context), []
    ends = []  # the main line's length at each state
    for block in range(config.prefix_blocks + config.states - 1):
        if block >= config.prefix_blocks:
            ends.append(len(line))
        line += await play(cast, episode, [*opening, *line], config.block_turns, "prefix", user_after=config.user_turns)
    ends.append(len(line))

    async def point(end: int) -> BranchPoint:
        state = [*opening, *line[:end]]
        # The path names the state: positions alone would give a later state's branch the seeds of an earlier
        # state's trajectory at the same position.
        return BranchPoint(end, list(await asyncio.gather(*(play_trajectory(cast, episode, state, config,
                                                                            f"t{len(state)}-branch{index}")
                                                            for index in range(config.branches)))))

    return Branched(episode, line, list(await asyncio.gather(*(point(end) for end in ends))))


def episode_rows(branched: Branched, config: EpisodeConfig, profile: str | None) -> list[dict]:
    """The episode's turns as rows of episodes.parquet: the main line once, then each state's trajectories."""
    opening = len(opening_turns(branched.episode.context))
    per_block = config.block_turns + int(config.user_turns)
    per_trajectory_block = config.block_turns + int(config.trajectory_user_turns)
    common = {"episode_id": branched.episode.id, "context_id": branched.episode.context.id, "user_profile": profile}
    rows = [{**common, "state_id": None, "branch": None, "block": k // per_block, "turn_idx": opening + k,
             **turn_row(turn)} for k, turn in enumerate(branched.line)]
    for point in branched.points:
        state = state_id(branched.episode.id, opening + point.turns)
        first_block = point.turns // per_block
        for index, trajectory in enumerate(point.trajectories):
            rows += [{**common, "state_id": state, "branch": index, "block": first_block + k // per_trajectory_block,
                      "turn_idx": opening + point.turns + k, **turn_row(turn)} for k, turn in enumerate(trajectory)]
    return rows


def generate_shard(setting: Setting, ids: list[str], out: Path) -> Artifact:
    """The branched episodes of some contexts, all in flight at once, through the request cache."""
    cache = shared_cache(setting.requests)
    cast = setting.cast.cast(cache)
    by_id = read_contexts(setting.contexts)
    episodes = [Episode(by_id[i], setting.cast.profile_for(by_id[i], setting.seed), setting.seed) for i in ids]

    async def run(row) -> list[Branched]:
        async def one(episode: Episode) -> Branched:
            row.started()
            branched = await branch_episode(cast, episode, setting.episodes)
            row.finished()
            return branched

        return list(await asyncio.gather(*(one(episode) for episode in episodes)))

    with shard_progress(f"episodes {out.stem}", len(episodes), cache_hits(cache)) as row, request_batch():
        results = run_requests(run(row))
    rows = [r for branched in results
            for r in episode_rows(branched, setting.episodes,
                                  branched.episode.profile.id if branched.episode.profile else None)]
    return write_parquet(pl.DataFrame(rows, schema=EPISODE_SCHEMA), out)


@dataclass(frozen=True)
class StoredState:
    """A branch point read back from episodes.parquet: the context, the turns so far, and its trajectories."""

    id: str
    context: Context
    profile: str | None
    state: list[Turn]
    branches: dict[int, list[Turn]]


def read_states(episodes: Artifact, contexts: Artifact) -> list[StoredState]:
    """Every episode's branch points with their trajectories, in file order."""
    by_id = read_contexts(contexts)
    frame = episodes.read_parquet()
    states = []
    for (_,), rows in frame.group_by("episode_id", maintain_order=True):
        context = by_id[rows["context_id"][0]]
        opening = opening_turns(context)
        line = [row_turn(r) for r in rows.filter(pl.col("branch").is_null()).sort("turn_idx").iter_rows(named=True)]
        branched = rows.filter(pl.col("branch").is_not_null()).sort("branch", "turn_idx")
        for (state,), trajectories in branched.group_by("state_id", maintain_order=True):
            start = trajectories["turn_idx"].min() - len(opening)
            branches = {index: [row_turn(r) for r in group.iter_rows(named=True)]
                        for (index,), group in trajectories.group_by("branch", maintain_order=True)}
            states.append(StoredState(state, context, rows["user_profile"][0], [*opening, *line[:start]], branches))
    return states
