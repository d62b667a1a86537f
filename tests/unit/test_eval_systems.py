"""The systems under test, read from the requests that reach a loopback OpenAI-compatible server.

Each role is a model name on one server (as vLLM serves LoRA modules by name), so the request
bodies say who was asked: which Speaker, which Director or none, with which prompt and how many
samples, and with which seeds.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from chat_server import make_app
from loopback_servers import serve
from test_cli import REPO

from mascot.config import BackendConfig, DataConfig
from mascot.config.evaluation import SYSTEM_NAMES
from mascot.data.contexts import write_contexts
from mascot.dialogue.directives import FALLBACK_INSTRUCTION
from mascot.evaluation.conversations import ConversationJob, play_shard, write_eval_contexts
from mascot.evaluation.systems import (
    REPLY_MARKER,
    SYSTEMS,
    Components,
    FewShotExample,
    most_typical,
    strip_reasoning,
    system_setup,
)
from mascot.roster import load_roster, load_user_profiles

ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
ASSISTANT = load_roster(REPO / "configs" / "rosters" / "assistant_emotional_support.yaml")
PROFILES = load_user_profiles(REPO / "configs" / "users" / "big_five.yaml").profiles
EXAMPLES = [FewShotExample(context_id="ed:train:x", message="My dog ran away today.",
                           reply="That must be frightening; I hope he comes home soon.")]
ROLES = ("base-speaker", "speaker", "base-director", "director", "director-dpo", "sft", "user")


@pytest.fixture(scope="module")
def chat():
    app = make_app(seconds_per_token=0.0005)
    with serve(app) as url:
        yield app, url


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("contexts")
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 8},
        "held_out": [{"source": "esconv", "path": "samples:esconv/ESConv.json", "split": "test", "limit": 2}],
        "held_out_fraction": 0.25})
    stage1 = write_contexts(data, 0, folder / "stage1.parquet")
    return stage1, write_eval_contexts(data, stage1, 0, True, folder / "eval.parquet")


def parts(url: str) -> Components:
    backends = {role: BackendConfig(kind="openai", model=role, base_url=f"{url}/v1", max_concurrency=4,
                                    params={"max_new_tokens": 6}) for role in ROLES}
    return Components(base_speaker=backends["base-speaker"], trained_speaker=backends["speaker"],
                      base_director=backends["base-director"], trained_director=backends["director"],
                      trained_director_dpo=backends["director-dpo"], sft_speaker=backends["sft"], user=backends["user"])


def play(name, chat, contexts, tmp_path, block_tokens=12, **cot):
    app, url = chat
    app.state.stats = type(app.state.stats)()
    setup = system_setup(name, parts(url), ROSTER, ASSISTANT, PROFILES, block_turns=2, max_directive_attempts=2,
                         examples=EXAMPLES, self_consistency_samples=3, block_tokens=block_tokens, **cot)
    frame = contexts[1].read_parquet()
    job = ConversationJob(system=setup, contexts=contexts[1], seeds=[0, 1], blocks=2,
                          requests=tmp_path / f"{name}.sqlite")
    table = play_shard(job, frame["context_id"].to_list()[:2], tmp_path / f"{name}.parquet").read_parquet()
    bodies = [json.loads(body) for body in app.state.stats.seen]
    return table, bodies


def by_model(bodies: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for body in bodies:
        grouped.setdefault(body["model"], []).append(body)
    return grouped


def test_evaluation_contexts_are_the_held_out_ones_and_the_out_of_domain_corpus(contexts):
    stage1, evaluation = contexts
    frame = evaluation.read_parquet()
    held_out = set(stage1.read_parquet().filter(pl.col("held_out"))["context_id"].to_list())
    assert set(frame.filter(pl.col("eval_set") == "held_out")["context_id"].to_list()) == held_out
    ood = frame.filter(pl.col("out_of_domain"))
    assert ood.height == 2 and set(ood["eval_set"].to_list()) == {"esconv:test"}
    assert ood["source"].to_list() == ["esconv", "esconv"]


@pytest.mark.parametrize("name", ["mascot", "mascot_dpo", "multi_agent", "mascot_p"])
def test_group_systems_ask_their_own_speaker_and_director(name, chat, contexts, tmp_path):
    table, bodies = play(name, chat, contexts, tmp_path)
    asked = by_model(bodies)
    trained = name != "multi_agent"
    director = {"multi_agent": "base-director", "mascot_dpo": "director-dpo"}.get(name, "director")
    assert set(asked) == {"speaker" if trained else "base-speaker", director, "user"}
    # 2 contexts x 2 seeds; 2 blocks of 2 companion turns, the user's turn between them.
    assert table.height == 4 * 5
    assert table.group_by("context_id", "seed").agg(pl.col("role"))["role"].to_list()[0] == \
        ["companion", "companion", "user", "companion", "companion"]
    for body in asked["speaker" if trained else "base-speaker"]:
        system = body["messages"][0]["content"]
        persona = next(p for p in ROSTER.active if f"You are {p.name}," in system)
        assert (persona.description in system) is (name != "mascot_p")
        assert "director asks you to" in system


def test_mascot_c_keeps_the_trained_directors_instruction_and_randomises_only_the_speaker(chat, contexts, tmp_path):
    import random

    table, bodies = play("mascot_c", chat, contexts, tmp_path)
    assert set(by_model(bodies)) == {"speaker", "director", "user"}  # the trained Director is asked
    companions = table.filter(pl.col("role") == "companion")
    assert not companions["fallback"].any() and companions["speaker"].n_unique() > 1
    speakers = [persona.id for persona in ROSTER.active]
    for row in companions.iter_rows(named=True):
        directive = json.loads(row["directive"])
        # The persona is the request seed's draw, whatever the Director named; the instruction is the Director's.
        assert row["speaker"] == directive["next_speaker"] == random.Random(row["director_seed"]).choice(speakers)
        assert directive["instruction"] != FALLBACK_INSTRUCTION


def test_mascot_c_generic_plays_a_random_order_with_the_generic_instruction_and_no_director(chat, contexts, tmp_path):
    table, bodies = play("mascot_c_generic", chat, contexts, tmp_path)
    assert set(by_model(bodies)) == {"speaker", "user"}  # no Director was asked
    companions = table.filter(pl.col("role") == "companion")
    assert not companions["fallback"].any() and companions["speaker"].n_unique() > 1
    assert {json.loads(d)["instruction"] for d in companions["directive"]} == {FALLBACK_INSTRUCTION}


def test_the_random_speaker_passes_an_invalid_directive_on_for_the_episode_to_retry():
    import asyncio
    import random

    from mascot.config import SamplingParams
    from mascot.evaluation.systems import RandomSpeaker

    class Backend:
        kind, model = "fake", "fake"

        async def generate(self, messages, n, params, seed, response_format=None):
            return ['{"next_speaker": "anchor", "instruction": "Ask what happened.", "tone": "warm"}', "not json"]

    replies = asyncio.run(RandomSpeaker(Backend(), ROSTER).generate([], 2, SamplingParams(), seed=3))
    kept = json.loads(replies[0])
    assert kept["instruction"] == "Ask what happened." and kept["tone"] == "warm"
    assert kept["next_speaker"] == random.Random(3).choice([p.id for p in ROSTER.active])
    assert replies[1] == "not json"


@pytest.mark.parametrize("name", [n for n in SYSTEM_NAMES if not SYSTEMS[n].group])
def test_single_assistant_baselines(name, chat, contexts, tmp_path):
    table, bodies = play(name, chat, contexts, tmp_path)
    asked = by_model(bodies)
    speaker = "sft" if name == "sft" else "base-speaker"  # SFT's adapter; the others prompt the base Speaker
    assert set(asked) == {speaker, "user"}
    assert table.height == 4 * 3 and set(table.filter(pl.col("role") == "companion")["speaker"]) == {"assistant"}
    for body in asked[speaker]:
        system = body["messages"][0]["content"]
        assert system.startswith("You are Assistant, a supportive assistant") and "director" not in system
        assert (REPLY_MARKER in system) is name.endswith("_cot")
        shots = body["messages"][1:3]
        assert (shots == [{"role": "user", "content": EXAMPLES[0].message},
                          {"role": "assistant", "content": EXAMPLES[0].reply}]) is name.startswith("few_shot")
        assert body.get("n", 1) == (3 if name == "self_consistency" else 1)
    marked = table.filter(pl.col("role") == "companion")["reasoning_marked"]
    # The loopback server's words carry no marker: a CoT reply is kept whole, and says so.
    assert marked.to_list() == ([False] * 8 if name.endswith("_cot") else [None] * 8)


def test_systems_draw_the_same_seeds_at_the_same_place(chat, contexts, tmp_path):
    seeds = {}
    for name in ("mascot", "multi_agent"):
        _, bodies = play(name, chat, contexts, tmp_path)
        seeds[name] = sorted(b["seed"] for b in bodies if b["model"] in ("speaker", "base-speaker"))
    assert seeds["mascot"] == seeds["multi_agent"]


SPEAKERS = {"base-speaker", "speaker", "sft"}


@pytest.mark.parametrize("block_tokens", [12, 20])
def test_every_system_may_write_the_same_companion_tokens_per_block(block_tokens, chat, contexts, tmp_path):
    """The requests' max_tokens: a group's two turns get half the block's budget each, a single assistant's one reply
    all of it; the loopback server writes max_tokens words, so the words per block the judges see match too."""
    per_block, words = {}, {}
    for name in ("mascot", "multi_agent", "mascot_c", "zero_shot", "few_shot_cot", "sft", "self_consistency"):
        table, bodies = play(name, chat, contexts, tmp_path, block_tokens)
        caps = {body["max_tokens"] for body in bodies if body["model"] in SPEAKERS}
        turns = 2 if SYSTEMS[name].group else 1
        assert caps == {block_tokens // turns}, name
        per_block[name] = turns * caps.pop()
        companions = table.filter(pl.col("role") == "companion").with_columns(
            words=pl.col("text").str.split(" ").list.len())
        words[name] = set(companions.group_by("context_id", "seed", "block").agg(pl.col("words").sum())["words"])
    assert set(per_block.values()) == {block_tokens}
    assert all(counts == {block_tokens} for counts in words.values()), words


def test_a_budget_that_does_not_split_over_a_groups_turns_is_refused(chat):
    with pytest.raises(ValueError, match="13 companion tokens per block do not split equally over 2 turns"):
        system_setup("mascot", parts(chat[1]), ROSTER, ASSISTANT, PROFILES, block_turns=2, max_directive_attempts=2,
                     block_tokens=13)
    assert system_setup("zero_shot", parts(chat[1]), ROSTER, ASSISTANT, PROFILES, block_turns=2,
                        max_directive_attempts=2, block_tokens=13).budget == {
        "turns": 1, "turn_tokens": 13, "block_tokens": 13, "samples": 1, "reasoning_tokens": 0, "attempts": 1,
        "generated_tokens": 13}
    # Self-Consistency writes one reply per turn but samples N: its compute is N times the others'.
    assert system_setup("self_consistency", parts(chat[1]), ROSTER, ASSISTANT, PROFILES, block_turns=2,
                        max_directive_attempts=2, self_consistency_samples=5, block_tokens=12).budget == {
        "turns": 1, "turn_tokens": 12, "block_tokens": 12, "samples": 5, "reasoning_tokens": 0, "attempts": 1,
        "generated_tokens": 60}


def test_the_default_budget_keeps_the_trained_speakers_turn_length(chat):
    from mascot.evaluation.systems import default_block_tokens

    components = parts(chat[1])
    assert default_block_tokens(3, components) == 3 * components.trained_speaker.params.max_new_tokens == 18


def test_cot_reasons_in_its_own_tokens_and_a_reply_without_its_marker_is_sampled_again(chat, contexts, tmp_path):
    table, bodies = play("zero_shot_cot", chat, contexts, tmp_path, cot_reasoning_tokens=5, cot_attempts=3)
    asked = [body for body in bodies if body["model"] == "base-speaker"]
    # The reply's share of the block (12) plus the reasoning's own 5 tokens, for every sampling.
    assert {body["max_tokens"] for body in asked} == {17}
    companions = table.filter(pl.col("role") == "companion")
    # The loopback server never writes the marker: each turn is sampled 3 times, the first with the turn's own
    # seed (as every system's turn is), then with seeds of its own, and counted as a failure.
    assert len(asked) == 3 * companions.height
    assert set(companions["reasoning_attempts"]) == {3} and not companions["reasoning_marked"].any()
    assert set(companions["request_seed"]) <= {body["seed"] for body in asked}
    assert len({body["seed"] for body in asked}) == 3 * companions.height
    setup = system_setup("zero_shot_cot", parts(chat[1]), ROSTER, ASSISTANT, PROFILES, block_turns=2,
                         max_directive_attempts=2, block_tokens=12, cot_reasoning_tokens=5, cot_attempts=3)
    assert setup.budget["block_tokens"] == 12 and setup.budget["reasoning_tokens"] == 5  # the reply stays matched
    # Only CoT systems get the reasoning budget and the attempts.
    plain = system_setup("zero_shot", parts(chat[1]), ROSTER, ASSISTANT, PROFILES, block_turns=2,
                         max_directive_attempts=2, block_tokens=12, cot_reasoning_tokens=5, cot_attempts=3)
    assert plain.speaker.params.max_new_tokens == 12 and plain.cot_attempts == 1


def test_a_cot_turn_stops_sampling_at_the_first_reply_with_its_marker():
    import asyncio

    from mascot.config import SamplingParams
    from mascot.evaluation.systems import AssistantReplies

    class Backend:
        kind, model = "fake", "fake"

        def __init__(self):
            self.seeds = []

        async def generate(self, messages, n, params, seed, response_format=None):
            self.seeds.append(seed)
            return [f"thinking {REPLY_MARKER} reply {len(self.seeds)}" if len(self.seeds) == 2 else "just thinking"] * n

    backend = Backend()
    speaker = AssistantReplies(backend, 1, cot=True, attempts=3)
    assert asyncio.run(speaker.generate([], 1, SamplingParams(), seed=7)) == ["reply 2"]
    assert backend.seeds[0] == 7 and len(backend.seeds) == 2 and backend.seeds[1] != 7
    assert speaker.marked[7] is True and speaker.attempts[7] == 2


def test_reasoning_is_stripped_after_the_last_marker():
    assert strip_reasoning(f"Reasoning: they are sad.\n{REPLY_MARKER} I am here for you.") == ("I am here for you.", True)
    assert strip_reasoning(f"{REPLY_MARKER} draft {REPLY_MARKER} final") == ("final", True)
    assert strip_reasoning("no marker at all") == ("no marker at all", False)
    assert strip_reasoning(f"Reasoning only {REPLY_MARKER}  ") == (f"Reasoning only {REPLY_MARKER}", False)


def test_self_consistency_keeps_the_most_typical_reply():
    replies = ["I hear you, that is hard.", "Buy a boat.", "I hear you, that sounds hard.", "that is hard, I hear"]
    assert most_typical(replies) == 0
    assert most_typical(["a", "b"]) == 0  # ties go to the first


def test_the_evaluation_plays_mascot_with_each_director_trained_and_sft_with_its_adapter(tmp_path, tiny_config):
    from flows.evaluate import components, evaluation_systems
    from mascot.artifacts import Artifact

    listed = list(tiny_config.eval.systems)
    adapters = {name: Artifact(path=tmp_path / name, sha256="0" * 64) for name in ("director", "director_dpo", "sft")}
    grpo_only = {"grpo": adapters["director"]}
    both = {**grpo_only, "dpo": adapters["director_dpo"]}
    assert evaluation_systems(listed, grpo_only, "c.yaml") == listed
    assert evaluation_systems(listed, both, "c.yaml") == [listed[0], "mascot_dpo", *listed[1:]]
    with pytest.raises(FileNotFoundError, match="trained no DPO Director.*--director-method dpo"):
        evaluation_systems([*listed, "mascot_dpo"], grpo_only, "c.yaml")

    parts = components(tiny_config, Artifact(path=tmp_path / "speaker", sha256="0" * 64), both, adapters["sft"],
                       tmp_path)
    assert parts.trained_director.adapter == adapters["director"].path
    assert parts.trained_director_dpo.adapter == adapters["director_dpo"].path
    assert parts.trained_director_dpo.model == tiny_config.train.director_dpo.model
    assert parts.sft_speaker.adapter == adapters["sft"].path and parts.sft_speaker.model == tiny_config.train.sft.model
    assert parts.sft_speaker.params == tiny_config.generation.params  # sampled as the other baselines are
    assert components(tiny_config, Artifact(path=tmp_path / "speaker", sha256="0" * 64), grpo_only,
                      None, tmp_path).trained_director_dpo is None


def test_a_run_with_only_a_dpo_director_is_told_to_train_the_papers_one(tmp_path):
    from flows.evaluate import trained_directors
    from mascot.artifacts import RunDir, write_json

    run = RunDir(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="stage2/director"):
        trained_directors(run, "c.yaml")
    dpo = write_json({"method": "dpo"}, run.root / "stage2" / "director_dpo" / "metrics.json")
    run.record({"stage2/director_dpo": dpo})
    with pytest.raises(FileNotFoundError, match=r"trained only a DPO Director.*GRPO one.*mascot run stage2 --config c"):
        trained_directors(run, "c.yaml")
    grpo = write_json({"method": "grpo"}, run.root / "stage2" / "director" / "metrics.json")
    run.record({"stage2/director": grpo})
    assert set(trained_directors(run, "c.yaml")) == {"grpo", "dpo"}


def test_the_configs_lists_of_group_systems_and_automatic_metrics_are_the_evaluations():
    from mascot.config.evaluation import AUTOMATIC_METRICS, GROUP_SYSTEMS
    from mascot.evaluation.metrics import automatic_metrics

    assert GROUP_SYSTEMS == {name for name, spec in SYSTEMS.items() if spec.group}
    assert tuple(automatic_metrics(["one turn here", "and another"])) == AUTOMATIC_METRICS
