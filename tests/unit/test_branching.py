"""The branching episode generator and the Director's trajectory rollouts, against loopback OpenAI-compatible
servers with structured output.

The servers keep every request body they receive, so what is shared, and who was asked, is read from
outside: no request body arrives twice, each branch's first request carries the state's turns byte for
byte, and the policy's server receives every later directive of a rollout while the base Director's
receives none.
"""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest
from chat_server import make_app
from loopback_servers import serve
from test_cli import REPO

from mascot.config import BackendConfig, DataConfig, EpisodeConfig
from mascot.data.contexts import write_contexts
from mascot.dialogue.directives import director_messages
from mascot.dialogue.episodes import directive_json
from mascot.dialogue.turns import Directive, opening_turns
from mascot.roster import load_roster, load_user_profiles
from mascot.stage2.branching import CastSpec, Setting, generate_shard, read_states
from mascot.stage2.trajectories import trajectory_prompt, trajectory_text
from mascot.train.reward_model import RewardModelScorer

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
EPISODES = EpisodeConfig(block_turns=2, prefix_blocks=1, states=2, trajectory_blocks=2, branches=3,
                         max_directive_attempts=2)
CONTEXTS = 2
LIMIT = 4  # requests in flight, for every role together: they share one server and model


class Server:
    def __init__(self, app, url: str):
        self.app, self.url = app, url

    def reset(self) -> None:
        self.app.state.stats = type(self.app.state.stats)()

    @property
    def stats(self):
        return self.app.state.stats

    def bodies(self) -> list[dict]:
        return [json.loads(body) for body in self.stats.seen]


@pytest.fixture(scope="module")
def chat():
    app = make_app(seconds_per_token=0.001)
    with serve(app) as url:
        yield Server(app, url)


@pytest.fixture(scope="module")
def policy_server():
    app = make_app(seconds_per_token=0.001)
    with serve(app) as url:
        yield Server(app, url)


def backend(server: Server) -> BackendConfig:
    return BackendConfig(kind="openai", model="sim-chat", base_url=f"{server.url}/v1", max_concurrency=LIMIT,
                         params={"max_new_tokens": 6})


def setting(chat: Server, folder, episodes: EpisodeConfig = EPISODES) -> Setting:
    users = load_user_profiles(REPO / "configs" / "users" / "big_five.yaml").profiles
    cast = CastSpec(roster=ROSTER, director=backend(chat), speaker=backend(chat), user=backend(chat), profiles=users,
                    max_directive_attempts=episodes.max_directive_attempts)
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": CONTEXTS}})
    contexts = write_contexts(data, 0, folder / "contexts.parquet")
    return Setting(cast=cast, episodes=episodes, seed=0, contexts=contexts, requests=folder / "requests.sqlite")


def ids(setting: Setting) -> list[str]:
    return setting.contexts.read_parquet()["context_id"].to_list()


def test_branches_share_their_state_byte_for_byte_and_by_request(tmp_path, chat):
    shard = setting(chat, tmp_path)
    chat.reset()
    episodes = generate_shard(shard, ids(shard), tmp_path / "episodes.parquet")
    seen = chat.stats
    # Structured output keeps every directive valid at the first attempt: a Director and a Speaker request per
    # companion turn, a request per user turn. The main line (2 blocks, each 2 companion turns and the user's) is
    # asked once; each of the 2 states' 3 trajectories plays 2 such blocks.
    per_block = 2 * 2 + 1
    per_episode = 2 * per_block + EPISODES.states * EPISODES.branches * 2 * per_block
    assert seen.requests == CONTEXTS * per_episode and seen.repeated == 0, seen.report()
    # Episodes, their states and the branches of one are in flight together, under the backend's one limit.
    assert seen.max_in_flight == LIMIT, seen.report()

    by_seed = {body["seed"]: body for body in chat.bodies()}
    frame = episodes.read_parquet()
    states = read_states(episodes, shard.contexts)
    assert len(states) == CONTEXTS * EPISODES.states
    for state in states:
        opening = len(opening_turns(state.context))
        assert len(state.state) - opening in (3, 6)  # after the first block, then after the second
        assert state.id == f"{state.context.id}|t{len(state.state)}"
        assert sorted(state.branches) == [0, 1, 2]
        for trajectory in state.branches.values():
            assert [t.role for t in trajectory] == ["companion", "companion", "user"] * 2
        # Every branch continues the very same state: its first request, the Director's at the branch point,
        # carries the state's turns, byte for byte, in the prompt that reached the server.
        for trajectory in state.branches.values():
            sent = by_seed[trajectory[0].director_seed]["messages"]
            assert sent == director_messages(ROSTER, state.state)
            content = sent[-1]["content"]
            positions = [content.index(f"{turn.speaker}: {turn.text}") for turn in state.state[opening:]]
            assert positions == sorted(positions)
        # Branches differ after the branch point (their own seeds), and name speakers of the roster.
        firsts = [trajectory[0] for trajectory in state.branches.values()]
        assert len({(t.seed, t.director_seed) for t in firsts}) == EPISODES.branches
        assert {t.speaker for trajectory in state.branches.values() for t in trajectory
                if t.role == "companion"} <= {p.id for p in ROSTER.active}
        assert not any(t.fallback for trajectory in state.branches.values() for t in trajectory)
    # The main line is stored once per episode, and the states are prefixes of it.
    line = frame.filter(pl.col("branch").is_null())
    assert line["state_id"].is_null().all() and line.height == CONTEXTS * 2 * 3
    assert frame["user_profile"].is_not_null().all()  # a Big Five profile of the domain plays the user

    # Asked again, every request is answered by the request cache and the file is the same, byte for byte.
    again = generate_shard(shard, ids(shard), tmp_path / "again.parquet")
    assert chat.stats.requests == seen.requests
    assert again.sha256 == episodes.sha256


def test_block_mode_branches_one_block_without_the_users_turn(tmp_path, chat):
    block = EpisodeConfig(block_turns=2, prefix_blocks=1, states=1, mode="block", branches=2)
    shard = setting(chat, tmp_path, block)
    states = read_states(generate_shard(shard, ids(shard), tmp_path / "episodes.parquet"), shard.contexts)
    assert all([t.role for t in trajectory] == ["companion", "companion"]
               for state in states for trajectory in state.branches.values())
    with pytest.raises(ValueError, match="trajectory_blocks must be 1"):
        EpisodeConfig(mode="block", trajectory_blocks=2)


def test_in_a_rollout_the_policy_makes_every_later_directive_and_the_reward_is_the_mean_of_its_rollouts(
        tmp_path, chat, policy_server, tiny_models):
    from mascot.stage2.director import TrajectoryReward, TrajectoryRollouts

    shard = setting(chat, tmp_path)
    states = read_states(generate_shard(shard, ids(shard), tmp_path / "episodes.parquet"), shard.contexts)
    # A group reward model whose training pairs' scores had mean 0.5 and sd 2 (metrics.json, as training writes it).
    group_rm = tmp_path / "group_rm"
    shutil.copytree(tiny_models.rm, group_rm)
    (group_rm / "metrics.json").write_text(json.dumps({"train": {"scores": {"mean": 0.5, "sd": 2.0}}}))
    rollouts = TrajectoryRollouts(shard, states, group_rm, "cpu")
    texts = [directive_json(Directive(next_speaker=speaker, instruction="Say what you notice."))
             for speaker in ("anchor", "catalyst")] + ["not a directive"]
    state_ids = [states[0].id] * 3
    chat.reset()
    policy_server.reset()
    draws = rollouts.play(state_ids, texts, 3, backend(policy_server))
    assert len(draws) == 3 and all(len(trajectories) == 3 for trajectories in draws)
    # The sampled directive opens each rollout (an invalid one is the flagged fallback, not retried); the policy's
    # server answers every later directive, one request each (read as written), and the base Director none.
    directors_turns = 2 * 2 - 1
    policy_requests = policy_server.bodies()
    assert len(policy_requests) == 3 * 3 * directors_turns and policy_server.stats.repeated == 0
    assert all(body.get("response_format") for body in policy_requests)
    assert not [body for body in chat.bodies() if body.get("response_format")]
    assert chat.stats.requests == 3 * 3 * (2 * 2 + 2) and chat.stats.repeated == 0  # Speaker and user turns
    # Every draw of every directive is in flight together (no barrier between draws).
    assert chat.stats.max_in_flight == LIMIT, chat.stats.report()
    for i, speaker in enumerate(("anchor", "catalyst")):
        assert {trajectories[i][0].speaker for trajectories in draws} == {speaker}
        assert len({trajectories[i][0].seed for trajectories in draws}) == 3  # each draw its own seed
    # Within a draw, the directives of one state meet the same random numbers: turn for turn, the same seeds.
    for trajectories in draws:
        assert len({tuple(turn.seed for turn in trajectory) for trajectory in trajectories}) == 1
    assert all(trajectories[2][0].fallback for trajectories in draws)
    # The invalid directive's fallback is drawn per draw (`fallback_seed`), not once for its state: its draws name
    # more than one persona, and its reward is a random persona's, not one the state fixes.
    assert len({trajectories[2][0].speaker for trajectories in draws}) > 1

    reward = TrajectoryReward(rollouts, 3, lambda: backend(policy_server))
    group, format_ = reward.functions
    completions = [[{"role": "assistant", "content": text}] for text in texts]
    scores = rollouts.score(state_ids, draws)
    # The reward is the raw score z-scored on the model's training pairs, so the format term's weight means the same
    # whatever scale a training run left the logits at.
    raw = RewardModelScorer(group_rm, name="raw").score(
        [trajectory_prompt(shard.roster, states[0].state)] * 3, [trajectory_text(shard.roster, t) for t in draws[1]])
    assert [s[1] for s in scores] == pytest.approx([(r - 0.5) / 2.0 for r in raw])
    requests = policy_server.stats.requests
    assert group([], completions, state_id=state_ids) == pytest.approx([sum(s) / 3 for s in scores])
    # The format term reads the same rollouts: no request is made for it.
    shares = format_([], completions, state_id=state_ids)
    assert policy_server.stats.requests == requests
    policy_valid = [[not t.fallback for t in trajectories[i] if t.role == "companion"]
                    for trajectories in draws for i in range(3)]
    assert all(valid[1:] == [True] * directors_turns for valid in policy_valid)  # structured output: all valid
    # The format term is the sampled directive's own validity: the policy's valid later directives do not pay for
    # the invalid third.
    assert shares == [1.0, 1.0, 0.0]
