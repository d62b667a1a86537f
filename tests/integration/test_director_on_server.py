"""The Director's later directives and its before/after comparison on the serving engine (issue 35, item 2).

Where the base Director's server loads adapters at runtime (`stage2.director` with `load_adapter`, as vLLM with
VLLM_ALLOW_RUNTIME_LORA_UPDATING), the GRPO Director's trajectory-mode rollouts hot-load each step's policy
snapshot into that server and ask it for every later directive under the snapshot's name; the before/after
comparison samples the base and the trained Director there too. Real TRL training of the tiny LM, two steps,
against a loopback server that plays vLLM (tests/served_models.py) with simulated replies, so that nothing but
the trainer could load a model into this process. What the server loaded, unloaded and was asked, it records;
the in-process model registry (`mascot.llm.transformers_backend`) is read beside it.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
from chat_server import make_app
from loopback_servers import serve
from served_models import ServedModels
from stage1_runs import REPO

from mascot.artifacts import dir_artifact
from mascot.config import BackendConfig, DataConfig, DirectorConfig, DirectorEvalConfig, EpisodeConfig
from mascot.data.contexts import write_contexts
from mascot.llm import transformers_backend
from mascot.roster import load_roster
from mascot.stage2.branching import CastSpec, Setting, generate_shard
from mascot.stage2.director import train_director
from mascot.stage2.director_eval import Directors, evaluate_directors
from mascot.train.grpo import served_policy

pytestmark = pytest.mark.integration

STEPS = 2
EPISODES = EpisodeConfig(block_turns=2, prefix_blocks=1, states=1, trajectory_blocks=1, branches=2)


class World:
    """The loopback vLLM, the Stage 2 setting played against it, and what training left."""

    def __init__(self, served: ServedModels, app, setting: Setting, policy: DirectorConfig, episodes, group_rm):
        self.served, self.app, self.setting, self.policy = served, app, setting, policy
        self.episodes, self.group_rm = episodes, group_rm
        self.adapter = None
        self.loaded_here: list[tuple] = []  # every (model, adapter, device) this process loaded while training
        self.held_before: set[tuple] = set()  # what the registry held before: earlier tests in the session may load

    def requests(self) -> list[dict]:
        return [json.loads(body) for body in self.app.state.stats.seen]

    def directive_requests(self) -> list[dict]:
        """The later directives' requests (a rollout asks for a directive's JSON schema) since the last reset."""
        return [body for body in self.requests() if body.get("response_format")]

    def reset(self) -> None:
        self.app.state.stats = type(self.app.state.stats)()
        self.served.loads.clear()
        self.served.unloads.clear()


def record_loads(monkeypatch, into: list) -> None:
    """Note every model the in-process registry loads (the registry itself, then the real load)."""
    load = transformers_backend.load_model

    def noted(model, adapter, device):
        into.append((model, adapter, device))
        return load(model, adapter, device)

    monkeypatch.setattr(transformers_backend, "load_model", noted)


@pytest.fixture(scope="module")
def world(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("director-on-server")
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 2},
        "held_out_fraction": 0.5})
    contexts = write_contexts(data, 0, folder / "contexts.parquet")
    served = ServedModels("base", allow_runtime_lora=True)
    app = make_app(seconds_per_token=0.0, served=served)
    group_rm = folder / "group_rm"
    shutil.copytree(tiny_models.rm, group_rm)
    (group_rm / "metrics.json").write_text(json.dumps({"train": {"scores": {"mean": 0.0, "sd": 1.0}}}))
    policy = DirectorConfig(model=str(tiny_models.lm), max_steps=STEPS, batch_size=4, num_generations=4,
                            max_completion_length=48, learning_rate=1e-3, temperature=0.9, top_p=0.9,
                            save_steps=STEPS, use_cpu=True, gradient_checkpointing=False, seed=0)
    with serve(app) as url:
        server = {"kind": "openai", "model": "base", "base_url": f"{url}/v1", "params": {"max_new_tokens": 6}}
        cast = CastSpec(roster=load_roster(data.roster), director=BackendConfig(**server, load_adapter=True),
                        speaker=BackendConfig(**server), user=BackendConfig(**server), profiles=[])
        setting = Setting(cast=cast, episodes=EPISODES, seed=0, contexts=contexts, requests=folder / "requests.sqlite")
        episodes = generate_shard(setting, contexts.read_parquet()["context_id"].to_list(), folder / "episodes.parquet")
        yield World(served, app, setting, policy, episodes, dir_artifact(group_rm))


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    """Two GRPO steps of the Director in trajectory mode, the server's record of them, and the registry's."""
    monkeypatch = pytest.MonkeyPatch()
    record_loads(monkeypatch, world.loaded_here)
    world.reset()
    world.held_before = set(transformers_backend.loaded_models())
    try:
        world.adapter = train_director(world.policy, world.setting, world.episodes, world.group_rm,
                                       tmp_path_factory.mktemp("director") / "director")
    finally:
        monkeypatch.undo()
    return world


def test_each_steps_snapshot_is_hot_loaded_and_makes_the_later_directives_on_the_server(trained):
    world = trained
    assert world.adapter is not None
    loads, requests = list(world.served.loads), world.directive_requests()
    # One snapshot per optimisation step, loaded under its content's name; the one before it unloaded when the
    # step moved on, and the last when training ended: the server holds none of them now.
    assert len(loads) == STEPS and len(set(loads)) == STEPS, loads
    assert loads == [f"director-{world.served.contents[name][:8]}" for name in loads], world.served.contents
    assert world.served.unloads == loads and not set(loads) & set(world.served.modules), world.served.unloads
    # Every later directive came from the server under a snapshot's name (none from the base Director), each
    # snapshot's in its own step, sampled as the config says.
    asked = Counter(body["model"] for body in requests)
    assert set(asked) == set(loads) and all(asked[name] > 0 for name in loads), asked
    for body in requests:
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.9, 0.9, 48), body
    # No copy of the Director's model was loaded into this process: not its base, not a snapshot.
    assert world.loaded_here == [] and set(transformers_backend.loaded_models()) <= world.held_before, world.loaded_here


def test_the_before_after_comparison_samples_both_directors_on_the_server(trained, tmp_path):
    world = trained
    world.reset()
    loaded_here, held_before = [], set(transformers_backend.loaded_models())
    monkeypatch = pytest.MonkeyPatch()
    record_loads(monkeypatch, loaded_here)
    directors = Directors(policy=world.policy, adapter=world.adapter, weights=world.policy.reward_weights,
                          server=served_policy(world.policy, world.setting.cast.director))
    try:
        scored = evaluate_directors(DirectorEvalConfig(samples_per_prompt=2, rollouts=1), directors, world.setting,
                                    world.episodes, world.group_rm, tmp_path / "scored.parquet").read_parquet()
    finally:
        monkeypatch.undo()
    trained_name = f"director-{world.adapter.sha256[:8]}"
    # The trained Director was loaded under its content's name (the one the evaluation and the chat use too), and
    # both Directors' directives, sampled and later, were asked of the server with the policy's sampling.
    assert world.served.loads == [trained_name] and world.served.contents[trained_name] == world.adapter.sha256
    asked = Counter(body["model"] for body in world.directive_requests())
    assert set(asked) == {"base", trained_name}, asked
    sampled = [body for body in world.requests() if body.get("n") == 2]  # the compared directives, 2 per state
    assert Counter(body["model"] for body in sampled) == {"base": 1, trained_name: 1}, sampled
    assert all((body["temperature"], body["top_p"], body["max_tokens"]) == (0.9, 0.9, 48)
               for body in [*sampled, *world.directive_requests()])
    assert sorted(scored["policy"].unique().to_list()) == ["base", "director"] and scored.height == 4
    assert loaded_here == [] and set(transformers_backend.loaded_models()) <= held_before, loaded_here
