"""The branching episode generator, against a loopback OpenAI-compatible server with structured output.

The server counts every request, so sharing the prefix "by request" is read from outside: no request
body arrives twice, and the count is exactly the prefix once plus each branch's own turns.
"""

from __future__ import annotations

import httpx
import polars as pl
import pytest
from chat_server import make_app
from loopback_servers import serve
from test_cli import REPO

from mascot.config import BackendConfig, DataConfig, EpisodeConfig
from mascot.data.contexts import write_contexts
from mascot.dialogue.turns import opening_turns
from mascot.roster import load_roster, load_user_profiles
from mascot.stage2.branching import CastSpec, Contexts, generate_shard, read_states

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
EPISODES = EpisodeConfig(block_turns=2, prefix_blocks=1, branches=3, max_directive_attempts=2)
CONTEXTS = 2
LIMIT = 4  # requests in flight, for every role together: they share one server and model


@pytest.fixture(scope="module")
def chat():
    with serve(make_app(seconds_per_token=0.001)) as url:
        yield url


def cast(chat: str) -> CastSpec:
    backend = BackendConfig(kind="openai", model="sim-chat", base_url=f"{chat}/v1", max_concurrency=LIMIT,
                            params={"max_new_tokens": 6})
    users = load_user_profiles(REPO / "configs" / "users" / "big_five.yaml").profiles
    return CastSpec(roster=ROSTER, director=backend, speaker=backend, user=backend, profiles=users,
                    max_directive_attempts=EPISODES.max_directive_attempts)


def contexts(folder):
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": CONTEXTS}})
    artifact = write_contexts(data, 0, folder / "contexts.parquet")
    return Contexts(contexts=artifact, ids=artifact.read_parquet()["context_id"].to_list())


def test_branches_share_their_prefix_byte_for_byte_and_by_request(tmp_path, chat):
    shard = contexts(tmp_path)
    httpx.post(f"{chat}/stats/reset")
    episodes = generate_shard(cast(chat), EPISODES, 0, shard, tmp_path / "requests.sqlite", tmp_path / "episodes.parquet")
    seen = httpx.get(f"{chat}/stats").json()
    # Structured output keeps every directive valid at the first attempt: a Director and a Speaker request per
    # companion turn, a request per user turn. The prefix (2 companion turns, 1 user turn) is asked once.
    per_episode = (2 * 2 + 1) + EPISODES.branches * (2 * 2)
    assert seen["requests"] == CONTEXTS * per_episode and seen["repeated"] == 0, seen
    # Episodes, and the branches of one, are in flight together, under the backend's one limit.
    assert seen["max_in_flight"] == LIMIT, seen

    frame = episodes.read_parquet()
    states = read_states(episodes, shard.contexts)
    assert len(states) == CONTEXTS
    for state in states:
        prefix = frame.filter(pl.col("state_id") == state.id, pl.col("branch").is_null())
        assert prefix.height == 3 and prefix["role"].to_list() == ["companion", "companion", "user"]
        assert sorted(state.branches) == [0, 1, 2] and all(len(block) == 2 for block in state.branches.values())
        # Every branch continues the very same state: it starts right after the prefix's last turn.
        starts = frame.filter(pl.col("state_id") == state.id, pl.col("branch").is_not_null()) \
            .group_by("branch").agg(pl.col("turn_idx").min())["turn_idx"].unique().to_list()
        assert starts == [len(opening_turns(state.context)) + 3]
        assert state.id == f"{state.context.id}|t{len(state.state)}"
        # Branches differ after the branch point (their own seeds), and name speakers of the roster.
        firsts = [block[0] for block in state.branches.values()]
        assert len({(t.seed, t.director_seed) for t in firsts}) == EPISODES.branches
        assert {t.speaker for block in state.branches.values() for t in block} <= {p.id for p in ROSTER.active}
        assert not any(t.fallback for block in state.branches.values() for t in block)
    assert frame["user_profile"].is_not_null().all()  # a Big Five profile of the domain plays the user

    # Asked again, every request is answered by the request cache and the file is the same, byte for byte.
    again = generate_shard(cast(chat), EPISODES, 0, shard, tmp_path / "requests.sqlite", tmp_path / "again.parquet")
    assert httpx.get(f"{chat}/stats").json()["requests"] == seen["requests"]
    assert again.sha256 == episodes.sha256


def test_the_directors_reward_is_the_mean_of_its_rollouts_all_in_flight_and_seeded_by_draw(tmp_path, chat, tiny_models):
    from mascot.config import DirectorConfig
    from mascot.dialogue.episodes import directive_json
    from mascot.dialogue.turns import Directive
    from mascot.stage2.director import GroupRMReward

    shard = contexts(tmp_path)
    requests = tmp_path / "requests.sqlite"
    states = read_states(generate_shard(cast(chat), EPISODES, 0, shard, requests, tmp_path / "episodes.parquet"),
                         shard.contexts)
    config = DirectorConfig(model="tiny:lm", use_cpu=True, rollouts=3)
    reward = GroupRMReward(cast(chat), states, tiny_models.rm, config, EPISODES.block_turns, 0, requests)
    texts = [directive_json(Directive(next_speaker=speaker, instruction="Say what you notice."))
             for speaker in ("anchor", "catalyst")]
    ids = [states[0].id] * 2
    httpx.post(f"{chat}/stats/reset")
    draws = reward.rollouts(ids, texts, 3)
    seen = httpx.get(f"{chat}/stats").json()
    assert len(draws) == 3 and all(len(blocks) == 2 and all(len(b) == 2 for b in blocks) for blocks in draws)
    # Every draw of every directive is in flight together (no barrier between draws), none asked twice.
    assert seen["max_in_flight"] == LIMIT and seen["repeated"] == 0, seen
    for i, speaker in enumerate(("anchor", "catalyst")):
        assert {blocks[i][0].speaker for blocks in draws} == {speaker}
        assert len({blocks[i][0].seed for blocks in draws}) == 3  # each draw its own seed
    # Draw 0 is what one rollout gives: the training's rollout when `rollouts` is 1.
    assert reward.rollouts(ids, texts, 1)[0] == draws[0]
    scores = reward.score(ids, draws)
    completions = [[{"role": "assistant", "content": text}] for text in texts]
    assert reward([], completions, state_id=ids) == pytest.approx([sum(s) / 3 for s in scores])
