"""The branching episode generator: a shared prefix, then M branches from the same state.

For every context, an episode plays `prefix_blocks` blocks (each followed by the simulated user's
turn), which brings it to its branch point: the state. From that state, M branches each ask the
Director for a directive with their own seed and play one block of N turns. The prefix is played
once and every branch continues the very same turns, so the branches share it byte for byte and
by request: no prefix request is made twice. The branches' blocks are what the group judge scores;
pairs of them feed the group reward model, and pairs of their first directives feed DPO.

episodes.parquet holds one row per turn: the prefix's rows have a null `branch`, each branch's
rows its index. A state's id is `<context id>|t<turn count>`, so tables keyed by state join with
contexts.parquet like Stage 1's query ids do (`mascot.queries.context_ids`).
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
from mascot.dialogue.episodes import Cast, Episode, play, row_turn, turn_row
from mascot.dialogue.turns import Turn, opening_turns
from mascot.llm import RequestCache, make_backend, request_batch, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.queries import request_seed
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
        """The roles' backends; `director` replaces the configured Director (a trained one, say)."""
        director = director or self.director
        return Cast(self.roster, make_backend(director, cache=cache), make_backend(self.speaker, cache=cache),
                    make_backend(self.user, cache=cache), director.params, self.speaker.params, self.user.params,
                    self.max_directive_attempts)

    def profile_for(self, context: Context, run_seed: int) -> UserProfile | None:
        """The episode's simulated user: one of the domain's profiles, chosen by seed, or none."""
        profiles = [p for p in self.profiles if context.domain in p.domains]
        return profiles[request_seed(run_seed, context.id, "user") % len(profiles)] if profiles else None


class Contexts(BaseModel):
    """Some contexts of a contexts artifact, as steps pass them (the artifact's hash makes it a cache key)."""

    model_config = ConfigDict(frozen=True)

    contexts: Artifact
    ids: list[str]

    def load(self) -> list[Context]:
        by_id = read_contexts(self.contexts)
        return [by_id[i] for i in self.ids]


@dataclass(frozen=True)
class Branched:
    episode: Episode
    prefix: list[Turn]  # after the opening, up to the branch point
    branches: list[list[Turn]]

    @property
    def state(self) -> list[Turn]:
        return [*opening_turns(self.episode.context), *self.prefix]

    @property
    def state_id(self) -> str:
        return state_id(self.episode.id, len(self.state))


def state_id(context_id: str, turns: int) -> str:
    return f"{context_id}|t{turns}"


async def branch_episode(cast: Cast, episode: Episode, config: EpisodeConfig) -> Branched:
    """Play the prefix once, then every branch from its end, the branches concurrently."""
    opening, prefix = opening_turns(episode.context), []
    for _ in range(config.prefix_blocks):
        prefix += await play(cast, episode, [*opening, *prefix], config.block_turns, "prefix",
                             user_after=config.user_turns)
    state = [*opening, *prefix]
    branches = await asyncio.gather(*(play(cast, episode, state, config.block_turns, f"branch{index}")
                                      for index in range(config.branches)))
    return Branched(episode, prefix, list(branches))


def episode_rows(branched: Branched, config: EpisodeConfig, profile: str | None) -> list[dict]:
    """The episode's turns as rows of episodes.parquet: the prefix once, then each branch."""
    opening = len(opening_turns(branched.episode.context))
    per_block = config.block_turns + int(config.user_turns)
    common = {"episode_id": branched.episode.id, "context_id": branched.episode.context.id,
              "state_id": branched.state_id, "user_profile": profile}
    rows = [{**common, "branch": None, "block": k // per_block, "turn_idx": opening + k, **turn_row(turn)}
            for k, turn in enumerate(branched.prefix)]
    for index, branch in enumerate(branched.branches):
        rows += [{**common, "branch": index, "block": config.prefix_blocks, "turn_idx": opening + len(branched.prefix) + k,
                  **turn_row(turn)} for k, turn in enumerate(branch)]
    return rows


def generate_shard(cast_spec: CastSpec, config: EpisodeConfig, seed: int, shard: Contexts, requests: Path,
                   out: Path) -> Artifact:
    """The branched episodes of one shard of contexts, all in flight at once, through the request cache."""
    cache = shared_cache(requests)
    cast = cast_spec.cast(cache)
    episodes = [Episode(context, cast_spec.profile_for(context, seed), seed) for context in shard.load()]

    async def run(row) -> list[Branched]:
        async def one(episode: Episode) -> Branched:
            row.started()
            branched = await branch_episode(cast, episode, config)
            row.finished()
            return branched

        return list(await asyncio.gather(*(one(episode) for episode in episodes)))

    with shard_progress(f"episodes {out.stem}", len(episodes), cache_hits(cache)) as row, request_batch():
        results = asyncio.run(run(row))
    rows = [r for branched in results
            for r in episode_rows(branched, config, branched.episode.profile.id if branched.episode.profile else None)]
    return write_parquet(pl.DataFrame(rows, schema=EPISODE_SCHEMA), out)


@dataclass(frozen=True)
class StoredState:
    """A branch point read back from episodes.parquet: the context, the turns so far, and its branches."""

    id: str
    context: Context
    profile: str | None
    state: list[Turn]
    branches: dict[int, list[Turn]]


def read_states(episodes: Artifact, contexts: Artifact) -> list[StoredState]:
    """Every episode's branch point with its branches, in file order."""
    by_id = read_contexts(contexts)
    frame = episodes.read_parquet()
    states = []
    for (state,), rows in frame.group_by("state_id", maintain_order=True):
        rows = rows.sort("branch", "turn_idx", nulls_last=False)
        context = by_id[rows["context_id"][0]]
        prefix = [row_turn(r) for r in rows.filter(pl.col("branch").is_null()).iter_rows(named=True)]
        branches = {index: [row_turn(r) for r in group.iter_rows(named=True)]
                    for (index,), group in rows.filter(pl.col("branch").is_not_null()).group_by("branch",
                                                                                                maintain_order=True)}
        states.append(StoredState(state, context, rows["user_profile"][0], [*opening_turns(context), *prefix],
                                  branches))
    return states
