"""Reward models: TRL's RewardTrainer on a table of preference pairs, and the trained model as a scorer.

One trainer serves every reward model of the recipe: the persona reward model of Stage 1 (pairs of
replies to one query) and the group reward model of Stage 2 (pairs of trajectories from one state).
The pairs are conversational: a `prompt` (chat messages), then the `chosen` or the `rejected`
reply. A scalar head on the base model (Qwen3-0.6B in the paper) learns to rank them
(Bradley-Terry loss). Pairs of held-out contexts (contexts.parquet's `held_out` column) are never
trained on; they measure pair accuracy, overall and per group (persona, say), with Wilson intervals. A
seeded sample of the training pairs measures the same, and the scale of the model's scores.

The result is a full model folder (`AutoModelForSequenceClassification.from_pretrained` loads it),
not a LoRA adapter: the whole network is trained, as the paper does for its reward models.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json
from mascot.config import RewardModelConfig
from mascot.data.contexts import context_clusters, held_out_ids
from mascot.queries import cluster_ids, context_ids
from mascot.stats import clustered_mean, describe, histogram, proportion
from mascot.torch_runtime import inference_dtype, quiet_transformers, require_torch
from mascot.train.runtime import (
    TrainingSetupError,
    checkpoint_dir,
    device_args,
    metrics_on_progress_bar,
    train_resuming,
    trainer_device,
    wandb_callbacks,
)

Messages = list[dict[str, str]]


class RewardModelScorer:
    """A trained reward model as a function of (prompt, reply): it scores the two as one chat.

    The chat is rendered with the tokenizer's chat template, as TRL's RewardTrainer rendered the
    training pairs, so a reply is scored in exactly the form the model learned from. Called as a
    TRL reward function, `fn(prompts, completions, **kwargs)`, it is logged under `name`. The weights run in
    `dtype`: by default the checkpoint's (float32, as the trainer saves it); `mascot.torch_runtime.inference_dtype`
    picks bf16 where the device has it.
    """

    def __init__(self, path: str | Path, *, name: str, device: str = "cpu", batch_size: int = 16,
                 chat_template_kwargs: dict[str, Any] | None = None, dtype: str = "auto"):
        torch = require_torch()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        with quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=dtype)
            self.model = self.model.to(device).eval()
        self.__name__ = name
        self.device, self.batch_size = device, batch_size
        self.chat_template_kwargs = chat_template_kwargs or {}
        self._torch = torch

    def score(self, prompts: list[Messages], replies: list[str]) -> list[float]:
        ids = [
            self.tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": reply}], tokenize=True,
                                               return_dict=True, **self.chat_template_kwargs)["input_ids"]
            for prompt, reply in zip(prompts, replies, strict=True)
        ]
        scores: list[float] = []
        for start in range(0, len(ids), self.batch_size):
            batch = self.tokenizer.pad({"input_ids": ids[start:start + self.batch_size]}, padding_side="right",
                                       return_tensors="pt").to(self.device)
            with self._torch.inference_mode():
                scores += self.model(**batch).logits[:, 0].float().tolist()
        return scores

    def __call__(self, prompts: list[Messages], completions: list[Messages | str], **_: Any) -> list[float]:
        replies = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return self.score(prompts, replies)


# A held-out measure beside pair accuracy: (the trained model, the held-out pairs, each context's cluster) -> metrics.
HeldOutMeasure = Callable[[RewardModelScorer, pl.DataFrame, Mapping[str, str]], dict]


def preference_records(pairs: pl.DataFrame) -> list[dict]:
    """TRL's conversational preference format with an explicit prompt."""
    return [
        {"prompt": row["prompt"], "chosen": [{"role": "assistant", "content": row["chosen"]}],
         "rejected": [{"role": "assistant", "content": row["rejected"]}]}
        for row in pairs.iter_rows(named=True)
    ]


def train_reward_model(config: RewardModelConfig, pairs: Artifact, contexts: Artifact, out: Path, *,
                       group_by: str, name: str,
                       held_out_measures: Mapping[str, HeldOutMeasure] | None = None) -> Artifact | None:
    """Train on the pairs of training contexts, resuming from checkpoints; write the model and metrics.json.

    `pairs` has `query_id` (whose context part marks it held out or not), `prompt`, `chosen`,
    `rejected` and the `group_by` column that held-out accuracy is broken down by. `name` labels the
    trainer's logs (`train/<name>/loss`) and the scorer. Each of `held_out_measures` (module-level functions,
    so that `accelerate launch` can pickle them) measures the trained model on the held-out pairs, given the
    contexts' clusters (`measure(model, pairs, clusters)`), and its result joins metrics.json's `held_out` under
    its key: the persona reward model's persona-swap test, say.
    """
    require_torch()
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed
    from trl import RewardConfig, RewardTrainer

    frame = pairs.read_parquet()
    held_out = held_out_ids(contexts)
    if not held_out:
        raise TrainingSetupError(f"{contexts.path} holds no held-out context to evaluate the reward model on; it "
                                 "needs at least 2 contexts (raise data.corpus.limit)")
    frame = frame.with_columns(held_out=context_ids(frame["query_id"]).is_in(held_out))
    train_pairs, eval_pairs = frame.filter(~pl.col("held_out")), frame.filter(pl.col("held_out"))
    if train_pairs.is_empty():
        raise TrainingSetupError(f"{pairs.path} has no pairs outside the held-out contexts, so there is nothing to "
                                 "train the reward model on; lower stage1.margin or add contexts (data.corpus.limit)")

    set_seed(config.seed)  # the new scalar head is initialised reproducibly
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(config.model)
        # float32 weights: with bf16 the trainer autocasts, and the optimizer keeps full precision.
        model = AutoModelForSequenceClassification.from_pretrained(config.model, num_labels=1, dtype="float32")
    model.config.pad_token_id = tokenizer.pad_token_id
    checkpoints = checkpoint_dir(out, config, pairs, contexts)
    args = RewardConfig(
        output_dir=str(checkpoints), learning_rate=config.learning_rate, num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=config.gradient_accumulation_steps,
        max_length=config.max_length, save_strategy="steps", save_steps=config.save_steps, save_total_limit=1,
        logging_steps=1, report_to="none", seed=config.seed, gradient_checkpointing=config.gradient_checkpointing,
        **device_args(config),
    )
    records = [{**r, "chat_template_kwargs": config.chat_template_kwargs} for r in preference_records(train_pairs)]
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(records),
                            processing_class=tokenizer, callbacks=wandb_callbacks(name))
    # RewardTrainer drops, while it builds, every pair longer than max_length: with none left it would fail on an
    # empty dataset in its first step, with no word about why.
    if not len(trainer.train_dataset):
        raise TrainingSetupError(f"every one of the {train_pairs.height} training pairs of {pairs.path} is longer than "
                                 f"{config.max_length} tokens (prompt and reply), so {name} has nothing to train on: "
                                 f"raise train.{name}.max_length")
    metrics_on_progress_bar(trainer, ["loss", "accuracy", "margin"])
    resume = train_resuming(trainer, checkpoints)
    if not trainer.is_world_process_zero():
        return None  # a later process of an `accelerate launch` (mascot.train.launch): the first one writes

    with quiet_transformers(), atomic_dir(out) as staging:
        trainer.save_model(str(staging))
        tokenizer.save_pretrained(staging)
        device = trainer_device(config)
        # Measured in bf16 where the GPU has it: the metrics rank pairs and estimate a scale, so they need no fp32;
        # a pair whose margin bf16 rounds to a tie counts as wrong, a rare case for a trained model.
        trained = RewardModelScorer(staging, name=name, device=device, dtype=inference_dtype(device),
                                    chat_template_kwargs=config.chat_template_kwargs)
        metrics = {
            **reward_model_accuracy(trained, train_pairs, eval_pairs, group_by, config.accuracy_sample_pairs,
                                    config.seed, held_out_measures, context_clusters(contexts)),
            "training": {"steps": trainer.state.global_step, "resumed_from_step": resume.step,
                         "steps_run": trainer.state.global_step - resume.step,
                         "train_pairs": train_pairs.height, "held_out_pairs": eval_pairs.height,
                         # RewardTrainer drops pairs longer than max_length; the report says how many.
                         "train_pairs_within_max_length": len(trainer.train_dataset), "max_length": config.max_length,
                         "held_out_contexts": sorted(held_out)},
        }
        write_json(metrics, staging / "metrics.json")
    shutil.rmtree(checkpoints, ignore_errors=True)  # the finished model supersedes them
    return dir_artifact(out)


def reward_model_accuracy(model: RewardModelScorer, train_pairs: pl.DataFrame, held_out_pairs: pl.DataFrame,
                          group_by: str, train_sample: int, seed: int,
                          held_out_measures: Mapping[str, HeldOutMeasure] | None = None,
                          clusters: Mapping[str, str] | None = None) -> dict:
    """metrics.json's `held_out` (every held-out pair, and each of `held_out_measures` on them) and `train` (a seeded
    sample of at most `train_sample` training pairs, with how many were scored of how many). `clusters` maps a
    context to its cluster (`context_clusters`), which the intervals resample."""
    sample = accuracy_sample(train_pairs, train_sample, seed)
    return {"held_out": {**pair_accuracy(model, held_out_pairs, group_by, clusters=clusters),
                         **{key: measure(model, held_out_pairs, clusters)
                            for key, measure in (held_out_measures or {}).items()}},
            "train": {**pair_accuracy(model, sample, group_by, clusters=clusters), "pairs_scored": sample.height,
                      "pairs": train_pairs.height, "sample_seed": seed}}


def accuracy_sample(pairs: pl.DataFrame, size: int, seed: int) -> pl.DataFrame:
    """At most `size` of `pairs`, drawn by `seed` without replacement, in the table's order: the same rows for the
    same table and seed. The training-pair accuracy is a check for overfitting, and `score_scale` is a scale
    estimate; a few thousand pairs measure both, where scoring all of them took hours at the paper's size."""
    if pairs.height <= size:
        return pairs
    return pairs[np.sort(np.random.default_rng(seed).choice(pairs.height, size, replace=False)).tolist()]


def pair_accuracy(model: RewardModelScorer, pairs: pl.DataFrame, group_by: str, confidence: float = 0.95,
                  clusters: Mapping[str, str] | None = None) -> dict:
    """Share of pairs where the chosen reply outscores the rejected one (ties count as wrong), with
    Wilson intervals overall and per `group_by` value, a bootstrap interval over the contexts' clusters (`clusters`,
    `cluster_ids`), and the distribution of reward margins."""
    if pairs.is_empty():
        return {"accuracy": proportion(0, 0, confidence), "accuracy_by_context": clustered_mean([], [], confidence),
                f"by_{group_by}": {}, "margin": describe([]),
                "margin_histogram": {"edges": [], "counts": []}}
    prompts = pairs["prompt"].to_list()
    chosen = model.score(prompts, pairs["chosen"].to_list())
    rejected = model.score(prompts, pairs["rejected"].to_list())
    scored = pairs.select(group_by).with_columns(margin=pl.Series([c - r for c, r in zip(chosen, rejected, strict=True)]))
    by_group = {
        group: proportion(int((rows["margin"] > 0).sum()), rows.height, confidence)
        for (group,), rows in sorted(scored.group_by(group_by), key=lambda item: item[0])
    }
    margins = scored["margin"].to_list()
    correct = (scored["margin"] > 0).cast(pl.Float64).to_list()
    return {"accuracy": proportion(int((scored["margin"] > 0).sum()), scored.height, confidence),
            # Pairs of one context, or of one meeting's windows, are not independent: this interval resamples clusters.
            "accuracy_by_context": clustered_mean(correct, cluster_ids(pairs["query_id"], clusters), confidence),
            f"by_{group_by}": by_group, "margin": describe(margins), "margin_histogram": histogram(margins),
            # Every reply's score: on the training pairs, the scale `score_scale` standardises by.
            "scores": describe([*chosen, *rejected])}


def score_scale(model: Path) -> tuple[float, float]:
    """The mean and sd of a trained reward model's scores of its training pairs' replies (metrics.json's
    `train.scores`). A raw score's scale is whatever one training run left it at, so a reward that weighs it
    against another term standardises it by these first. They are measured on the sample of training pairs that
    `accuracy_sample_pairs` bounds, maybe in bf16: an estimate of a mean and an sd from a few thousand scores is
    within a few percent of the whole set's, which is all a reward's weighting needs."""
    import json

    path = model / "metrics.json"
    try:
        scores = json.loads(path.read_text())["train"]["scores"]
        mean, sd = float(scores["mean"]), float(scores["sd"])
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise TrainingSetupError(f"{path}: no 'train.scores' with a mean and an sd ({exc!r}); the reward model was "
                                 "trained before its scores' scale was recorded: train it again") from None
    if not sd > 0:
        raise TrainingSetupError(f"{path}: 'train.scores.sd' is {sd}; a reward model that scores every training "
                                 "reply alike gives no reward to standardise")
    return mean, sd
