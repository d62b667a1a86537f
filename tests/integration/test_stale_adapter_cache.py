"""A retrained Speaker served under the same name is never answered from the old one's records (issue 34).

Train the Speaker (the project's GRPO trainer, on the tiny LM), serve it as the LoRA module `speaker` of a
loopback server that plays vLLM, and play Stage 2's episodes against it through the step the flow runs; retrain
it with another seed, serve the new adapter under the same name, as a person restarting vLLM would, and play
again on the same request cache. The second run's Speaker requests are counted at the server, and its
episodes are compared with the first's.
"""

from __future__ import annotations

import polars as pl
import pytest
from chat_server import make_app
from loopback_servers import serve
from served_models import ServedModels
from stage1_runs import REPO

from mascot.artifacts import Artifact
from mascot.config import BackendConfig, DataConfig, EpisodeConfig, GRPOPolicyConfig
from mascot.data.contexts import read_contexts, write_contexts
from mascot.llm.served_adapters import serve_adapter
from mascot.prompts import speaker_messages
from mascot.roster import load_roster
from mascot.stage2.branching import CastSpec, Setting, generate_shard
from mascot.train.grpo import train_grpo_policy

pytestmark = pytest.mark.integration

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
EPISODES = EpisodeConfig(block_turns=2, prefix_blocks=1, states=1, trajectory_blocks=1, branches=2)


def reply_length(prompts: list, completions: list, **_) -> list[float]:
    return [float(len(completion[0]["content"])) for completion in completions]


def train_speaker(lm, contexts: Artifact, folder, seed: int) -> Artifact:
    """One GRPO step of the Speaker (any reward will do: the adapter's weights follow the seed)."""
    policy = GRPOPolicyConfig(model=str(lm), seed=seed, max_steps=1, batch_size=2, num_generations=2,
                              max_completion_length=8, save_steps=1, use_cpu=True, gradient_checkpointing=False)
    prompts = [{"prompt": speaker_messages(ROSTER.get("anchor"), context)}
               for context in read_contexts(contexts).values()]
    adapter = train_grpo_policy(policy, prompts, [reply_length], [1.0], folder / "speaker",
                                folder / "checkpoints", name="stale-cache-speaker")
    assert adapter is not None
    return adapter


def test_a_retrained_speaker_under_the_same_served_name_reaches_the_server_and_changes_the_episodes(
        tiny_models, tmp_path):
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 1}})
    run = tmp_path / "runs" / "stale"
    contexts = write_contexts(data, 0, run / "stage1" / "contexts.parquet")
    served = ServedModels("base")
    app = make_app(seconds_per_token=0.0, served=served)

    def play(adapter: Artifact, name: str) -> pl.DataFrame:
        served.modules.clear()
        served.add("speaker", adapter.path)  # `vllm serve base --lora-modules speaker=<adapter>`, restarted
        base = {"kind": "openai", "base_url": f"{url}/v1", "params": {"max_new_tokens": 6}}
        speaker = serve_adapter(BackendConfig(model="speaker", **base), "speaker", adapter, run)
        cast = CastSpec(roster=ROSTER, director=BackendConfig(model="base", **base), speaker=speaker,
                        user=BackendConfig(model="base", **base), profiles=[])
        setting = Setting(cast=cast, episodes=EPISODES, seed=0, contexts=contexts, requests=run / "requests.sqlite")
        ids = contexts.read_parquet()["context_id"].to_list()
        return generate_shard(setting, ids, run / "stage2" / f"episodes-{name}.parquet").read_parquet()

    first_speaker = train_speaker(tiny_models.lm, contexts, run / "stage1" / "steps" / "seed0", seed=0)
    with serve(app) as url:
        first = play(first_speaker, "first")
        asked = dict(app.state.stats.by_model)
        assert asked["speaker"] > 0

        retrained = train_speaker(tiny_models.lm, contexts, run / "stage1" / "steps" / "seed1", seed=1)
        assert retrained.sha256 != first_speaker.sha256
        second = play(retrained, "second")
    again = {model: count - asked.get(model, 0) for model, count in app.state.stats.by_model.items()}
    # Every Speaker request of the second run reached the server: none was answered from the old adapter's records.
    assert again["speaker"] == asked["speaker"], (asked, again)
    speaker_turns = pl.col("role") == "companion"
    assert first.filter(speaker_turns)["text"].to_list() != second.filter(speaker_turns)["text"].to_list()
