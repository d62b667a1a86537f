"""Held-out split, preference records, checkpoint discovery and device checks (no training)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from mascot.config import RewardModelConfig
from mascot.data.contexts import held_out_contexts, write_contexts
from mascot.queries import Queries, context_ids
from mascot.roster import load_roster
from mascot.train.reward_model import preference_records
from mascot.train.runtime import Resume, TrainingSetupError, checkpoint_dir, device_args

CONTEXTS = [f"ed:train:hit:{i}_conv:{i}" for i in range(20)]


def test_held_out_split_is_seeded_sized_and_stable():
    held = held_out_contexts(CONTEXTS, 0.25, seed=0)
    assert len(held) == 5 and held <= set(CONTEXTS)
    assert held == held_out_contexts(list(reversed(CONTEXTS)), 0.25, seed=0)
    assert held != held_out_contexts(CONTEXTS, 0.25, seed=1)
    # Adding contexts never moves an existing one into training.
    grown = held_out_contexts([*CONTEXTS, *(f"new:{i}" for i in range(20))], 0.25, seed=0)
    assert {c for c in grown if c in CONTEXTS} <= held


def test_held_out_split_keeps_at_least_one_on_each_side():
    assert len(held_out_contexts(CONTEXTS[:3], 0.01, seed=0)) == 1
    assert len(held_out_contexts(CONTEXTS[:3], 0.99, seed=0)) == 2
    assert held_out_contexts(CONTEXTS[:1], 0.2, seed=0) == set(), "one context cannot be split; trainers say so"


def test_no_query_is_on_both_sides():
    held = held_out_contexts(CONTEXTS, 0.3, seed=0)
    queries = pl.Series([f"{c}|{p}" for c in CONTEXTS for p in ("anchor", "beacon")])
    flags = context_ids(queries).is_in(held)
    held_queries = set(queries.filter(flags))
    assert {q.rpartition("|")[0] for q in held_queries} == held
    assert not held_queries & set(queries.filter(~flags))


def test_contexts_parquet_carries_the_split_that_every_step_reads(tmp_path, tiny_config):
    artifact = write_contexts(tiny_config.data, tiny_config.run.seed, tmp_path / "contexts.parquet")
    frame = artifact.read_parquet()
    held = set(frame.filter(pl.col("held_out"))["context_id"])
    assert held == held_out_contexts(frame["context_id"], tiny_config.data.held_out_fraction, tiny_config.run.seed)
    queries = Queries(contexts=artifact, roster=load_roster(tiny_config.data.roster))
    held_ids, training_ids = queries.held_out().all_ids(), queries.held_out(False).all_ids()
    assert {q.rpartition("|")[0] for q in held_ids} == held
    assert not set(held_ids) & set(training_ids)
    assert sorted(held_ids + training_ids) == sorted(queries.all_ids())
    assert held_ids == sorted(held_ids, key=lambda q: q.rpartition("|")[0]), "sorted by context, not by file order"


def test_preference_records_are_trl_conversational_with_explicit_prompt():
    prompt = [{"role": "system", "content": "You are The Anchor."}, {"role": "user", "content": "I failed."}]
    pairs = pl.DataFrame({"prompt": [prompt], "chosen": ["That hurts."], "rejected": ["Try harder."]})
    assert preference_records(pairs) == [{"prompt": prompt, "chosen": [{"role": "assistant", "content": "That hurts."}],
                                          "rejected": [{"role": "assistant", "content": "Try harder."}]}]


def test_resume_picks_the_newest_complete_checkpoint(tmp_path):
    assert Resume.latest(tmp_path / "missing") == Resume(None, 0)
    for step in (2, 10, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-12").mkdir()  # killed while saving: no trainer_state.json yet
    (tmp_path / "checkpoint-x").mkdir()
    assert Resume.latest(tmp_path) == Resume(tmp_path / "checkpoint-10", 10)


def test_bf16_without_a_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TrainingSetupError, match="bf16 is true but no CUDA GPU"):
        device_args(RewardModelConfig(model="m", bf16=True))
    assert device_args(RewardModelConfig(model="m")) == {"use_cpu": True, "bf16": False}


def test_checkpoints_are_per_inputs_beside_the_output(tmp_path):
    out = tmp_path / "stage1" / "persona_rm"
    first = checkpoint_dir(out, RewardModelConfig(model="m"))
    assert first.parent == tmp_path / "stage1" / "checkpoints" and first.name.startswith("persona_rm-")
    assert first == checkpoint_dir(out, RewardModelConfig(model="m")), "a retry resumes in the same folder"
    assert first != checkpoint_dir(out, RewardModelConfig(model="m", learning_rate=1.0)), "changed inputs start afresh"


def test_vllm_generation_without_vllm_says_where_vllm_runs_and_the_way_out(tmp_path, tiny_config):
    import importlib.util

    from mascot.train.grpo import train_grpo_policy

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    config = tiny_config.train.speaker.model_copy(update={"use_vllm": True})
    with pytest.raises(ImportError, match=r"not installed in this process's environment.*deployments/README.md.*"
                                          r"use_vllm: false"):
        train_grpo_policy(config, [], [], [], tmp_path / "out", tmp_path / "checkpoints", name="speaker")


def test_a_reward_models_scale_is_read_from_its_metrics_or_refused_with_the_file_named(tmp_path):
    from mascot.train.reward_model import score_scale

    (tmp_path / "metrics.json").write_text(json.dumps({"train": {"scores": {"mean": -1.5, "sd": 0.25, "n": 40}}}))
    assert score_scale(tmp_path) == (-1.5, 0.25)
    (tmp_path / "metrics.json").write_text(json.dumps({"train": {"accuracy": {}}}))
    with pytest.raises(TrainingSetupError, match=r"metrics.json: no 'train.scores'.*train it again"):
        score_scale(tmp_path)
    (tmp_path / "metrics.json").write_text(json.dumps({"train": {"scores": {"mean": 1.0, "sd": 0.0}}}))
    with pytest.raises(TrainingSetupError, match=r"'train.scores.sd' is 0.0"):
        score_scale(tmp_path)


def test_pair_accuracy_records_the_scale_of_every_replys_score(tiny_models):
    from mascot.train.reward_model import RewardModelScorer, pair_accuracy

    prompt = [{"role": "user", "content": "I failed my exam."}]
    pairs = pl.DataFrame({"query_id": ["c1/anchor", "c2/anchor"], "persona": ["anchor", "anchor"],
                          "prompt": [prompt, prompt], "chosen": ["That sounds heavy.", "You can retake it."],
                          "rejected": ["Whatever.", "ok"]})
    scorer = RewardModelScorer(tiny_models.rm, name="rm")
    scores = scorer.score([prompt] * 4, ["That sounds heavy.", "You can retake it.", "Whatever.", "ok"])
    recorded = pair_accuracy(scorer, pairs, "persona")["scores"]
    assert recorded["n"] == 4 and recorded["mean"] == pytest.approx(sum(scores) / 4)
    assert recorded["sd"] == pytest.approx(float(pl.Series(scores).std()))


def test_pair_accuracy_resamples_the_contexts_clusters():
    from mascot.train.reward_model import pair_accuracy

    class Longer:  # prefers the longer reply
        def score(self, prompts, replies):
            return [float(len(reply)) for reply in replies]

    prompt = [{"role": "user", "content": "hi"}]
    pairs = pl.DataFrame({"query_id": [f"w{i}|anchor" for i in range(4)], "persona": ["anchor"] * 4,
                          "prompt": [prompt] * 4, "chosen": ["long reply", "long reply", "x", "long reply"],
                          "rejected": ["short", "short", "longer", "short"]})
    # Windows w0 and w1 of one meeting, w2 and w3 of another: two units, not four.
    by_meeting = pair_accuracy(Longer(), pairs, "persona", clusters={"w0": "m0", "w1": "m0", "w2": "m1", "w3": "m1"})
    assert by_meeting["accuracy_by_context"]["clusters"] == 2 and by_meeting["accuracy_by_context"]["value"] == 0.75
    assert pair_accuracy(Longer(), pairs, "persona")["accuracy_by_context"]["clusters"] == 4


def test_models_are_scored_in_bf16_only_on_a_gpu_that_has_it(tiny_models):
    import torch

    from mascot.torch_runtime import inference_dtype
    from mascot.train.reward_model import RewardModelScorer

    assert inference_dtype("cpu") == "float32", "bf16 on a CPU is emulated, slower than float32"
    assert inference_dtype("cpu", bf16_capable=True) == "float32"
    assert inference_dtype("cuda:1", bf16_capable=True) == "bfloat16"
    assert inference_dtype("cuda:0", bf16_capable=False) == "float32", "a V100 or T4 would only emulate bf16"
    assert RewardModelScorer(tiny_models.rm, name="rm", dtype="bfloat16").model.dtype == torch.bfloat16
    assert RewardModelScorer(tiny_models.rm, name="rm").model.dtype == torch.float32, "the checkpoint's dtype"


def accuracy_pairs(count: int, context: str) -> pl.DataFrame:
    prompt = [{"role": "user", "content": "I failed my exam."}]
    return pl.DataFrame({"query_id": [f"{context}{i % 3}|anchor" for i in range(count)], "persona": ["anchor"] * count,
                         "prompt": [prompt] * count, "chosen": [f"{context} chosen {i}" for i in range(count)],
                         "rejected": [f"{context} rejected {i}" for i in range(count)]})


def test_training_pair_accuracy_scores_a_seeded_sample_and_every_held_out_pair(tiny_models, tmp_path):
    from mascot.artifacts import write_json
    from mascot.train.reward_model import (
        RewardModelScorer,
        accuracy_sample,
        reward_model_accuracy,
        score_scale,
    )

    class RecordingScorer(RewardModelScorer):  # the real scorer, remembering every reply it scored
        def score(self, prompts, replies):
            scores = super().score(prompts, replies)
            self.scored.update(zip(replies, scores, strict=True))
            return scores

    train, held_out = accuracy_pairs(12, "train"), accuracy_pairs(5, "held")
    scorer = RecordingScorer(tiny_models.rm, name="rm")

    def scored_training_replies(seed: int) -> dict[str, float]:
        scorer.scored = {}
        metrics = reward_model_accuracy(scorer, train, held_out, "persona", train_sample=4, seed=seed)
        assert set(held_out["chosen"]) | set(held_out["rejected"]) <= set(scorer.scored), "held-out pairs scored whole"
        assert metrics["held_out"]["accuracy"]["n"] == 5
        assert (metrics["train"]["pairs_scored"], metrics["train"]["pairs"]) == (4, 12)
        assert metrics["train"]["accuracy"]["n"] == 4
        write_json(metrics, tmp_path / "metrics.json")
        return {reply: score for reply, score in scorer.scored.items() if reply.startswith("train")}

    first = scored_training_replies(seed=0)
    assert len(first) == 8, "4 training pairs of 12: their chosen and rejected replies, no others"
    sampled = pl.Series(list(first.values()))
    assert score_scale(tmp_path) == pytest.approx((sampled.mean(), sampled.std())), "the scale of the sample's scores"
    assert scored_training_replies(seed=0).keys() == first.keys(), "the same seed scores the same pairs"
    assert scored_training_replies(seed=1).keys() != first.keys()
    assert accuracy_sample(train, 4, seed=0).equals(accuracy_sample(train, 4, seed=0))
    assert accuracy_sample(train, 12, seed=0).equals(train) and accuracy_sample(train, 50, seed=0).equals(train)
