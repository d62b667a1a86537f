"""The SFT baseline: its training set holds only training contexts' best-judged replies, in the prompt it
is played with, and TRL's SFTTrainer on the tiny LM learns them (their likelihood rises)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from test_cli import REPO

from mascot.artifacts import write_parquet
from mascot.config import DataConfig
from mascot.config.training import SFTPolicyConfig
from mascot.data.contexts import read_contexts, write_contexts
from mascot.evaluation.baselines import sft_records
from mascot.evaluation.systems import assistant_messages
from mascot.roster import load_roster
from mascot.train.sft import train_sft_policy

ASSISTANT = load_roster(REPO / "configs" / "rosters" / "assistant_emotional_support.yaml")


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """Stage 1's contexts, and two personas' two candidates per context: the best is persona b's second."""
    folder = tmp_path_factory.mktemp("stage1")
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 8},
        "held_out_fraction": 0.25})
    contexts = write_contexts(data, 0, folder / "contexts.parquet")
    ids = contexts.read_parquet()["context_id"].to_list()
    candidates, judgments = [], []
    for number, context_id in enumerate(ids):
        for persona, scores in (("a", (2.0, 3.0)), ("b", (1.0, 4.5))):
            query = f"{context_id}|{persona}"
            for index, score in enumerate(scores):
                text = f"reply {persona}{index} to context {number}, that is lovely to hear"
                candidates.append({"query_id": query, "context_id": context_id, "persona": persona,
                                   "candidate_idx": index, "text": text})
                judgments.append({"query_id": query, "candidate_idx": index, "judge": "heuristic", "ok": True,
                                  "overall": score})
    # A failed judgment with the highest score must not count.
    judgments.append({"query_id": f"{ids[0]}|a", "candidate_idx": 0, "judge": "other", "ok": False, "overall": 99.0})
    return (contexts, write_parquet(pl.DataFrame(candidates), folder / "candidates.parquet"),
            write_parquet(pl.DataFrame(judgments), folder / "judgments.parquet"))


def test_sft_examples_are_training_contexts_best_replies_in_the_assistants_prompt(stage1):
    contexts, *_ = stage1
    records = sft_records(*stage1, ASSISTANT)
    frame, by_id = contexts.read_parquet(), read_contexts(contexts)
    training = frame.filter(~pl.col("held_out"))["context_id"].to_list()
    assert frame["held_out"].any() and len(records) == len(training)
    for context_id, record in zip(sorted(training), records, strict=True):  # by context id
        number = frame["context_id"].to_list().index(context_id)
        assert record["completion"] == [{"role": "assistant",
                                         "content": f"reply b1 to context {number}, that is lovely to hear"}]
        assert record["prompt"] == assistant_messages(ASSISTANT.active[0], by_id[context_id])


def mean_completion_nll(model_dir, adapter, records) -> float:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    losses = []
    with torch.inference_mode():
        for record in records:
            prompt = tokenizer.apply_chat_template(record["prompt"], add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]
            whole = tokenizer.apply_chat_template(record["prompt"] + record["completion"], tokenize=True,
                                                  return_dict=True)["input_ids"]
            labels = torch.tensor([[-100] * len(prompt) + whole[len(prompt):]])
            losses.append(model(input_ids=torch.tensor([whole]), labels=labels).loss.item())
    return sum(losses) / len(losses)


def test_sft_trains_a_lora_adapter_that_makes_the_chosen_replies_likelier(stage1, tiny_models, tmp_path):
    config = SFTPolicyConfig(model=str(tiny_models.lm), use_cpu=True, gradient_checkpointing=False,
                             lora={"r": 8, "alpha": 16}, learning_rate=5e-3, epochs=4, batch_size=2, seed=0)
    records = sft_records(*stage1, ASSISTANT)
    adapter = train_sft_policy(config, records, tmp_path / "sft", tmp_path / "checkpoints", name="sft")
    metrics = json.loads((adapter.verified() / "metrics.json").read_text())
    assert metrics["method"] == "sft" and metrics["training"]["examples"] == len(records)
    assert not (tmp_path / "checkpoints").exists()  # removed once the adapter is saved
    assert metrics["training"]["steps"] == 4 * len(records) // 2
    assert (adapter.path / "adapter_config.json").exists() and (adapter.path / "tokenizer.json").exists()
    before = mean_completion_nll(tiny_models.lm, None, records)
    after = mean_completion_nll(tiny_models.lm, adapter.path, records)
    assert after < 0.8 * before, (before, after)
