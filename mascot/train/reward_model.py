"""The persona reward model: TRL's RewardTrainer on the Stage 1 preference pairs.

The pairs are conversational: the persona's speaker prompt (system message) and the context,
then the chosen or the rejected reply. A scalar head on the base model (Qwen3-0.6B in the paper)
learns to rank them (Bradley-Terry loss). Pairs of held-out contexts are never trained on; they
measure pair accuracy, overall and per persona, with Wilson intervals.

The result is a full model folder (`AutoModelForSequenceClassification.from_pretrained` loads it),
not a LoRA adapter: the whole network is trained, as the paper does for its reward models.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json
from mascot.config import RewardModelTrainConfig, RunConfig
from mascot.evaluation.stats import describe, histogram, proportion
from mascot.llm.transformers_backend import quiet_transformers, require_torch, resolve_device
from mascot.rewards import PersonaRewardModel
from mascot.train.data import held_out_contexts, is_held_out, preference_records
from mascot.train.runtime import (
    Resume,
    TrainingSettings,
    TrainingSetupError,
    device_args,
    metrics_on_progress_bar,
    wandb_callbacks,
)


class RewardModelSettings(TrainingSettings):
    """Everything that decides the trained reward model (and so the task's cache key)."""

    train: RewardModelTrainConfig

    @classmethod
    def of(cls, config: RunConfig, base_model: str) -> RewardModelSettings:
        """The run config's slice; `base_model` is `models.persona_rm` resolved to a loadable path."""
        return cls(**cls.shared(config, base_model), train=config.train.persona_rm)


def train_reward_model(settings: RewardModelSettings, pairs: Artifact, contexts: Artifact, out: Path,
                       checkpoints: Path) -> Artifact:
    """Train on the training-side pairs, resuming from `checkpoints`; write the model and metrics.json."""
    require_torch()
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, set_seed
    from trl import RewardConfig, RewardTrainer

    frame = pairs.read_parquet()
    held_out = held_out_contexts(contexts.read_parquet()["context_id"], settings.held_out_fraction, settings.seed)
    frame = frame.with_columns(held_out=is_held_out(frame["query_id"], held_out))
    train_pairs, eval_pairs = frame.filter(~pl.col("held_out")), frame.filter(pl.col("held_out"))
    if train_pairs.is_empty():
        raise TrainingSetupError(f"{pairs.path} has no pairs outside the held-out contexts, so there is nothing to "
                                 "train the reward model on; lower stage1.margin or add contexts (data.corpus.limit)")

    set_seed(settings.seed)  # the new scalar head is initialised reproducibly
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(settings.base_model)
        # float32 weights: with train.bf16 the trainer autocasts, and the optimizer keeps full precision.
        model = AutoModelForSequenceClassification.from_pretrained(settings.base_model, num_labels=1,
                                                                   dtype="float32")
    model.config.pad_token_id = tokenizer.pad_token_id
    args = RewardConfig(
        output_dir=str(checkpoints), learning_rate=settings.train.learning_rate,
        num_train_epochs=settings.train.epochs, per_device_train_batch_size=settings.train.batch_size,
        gradient_accumulation_steps=settings.train.gradient_accumulation_steps,
        max_length=settings.train.max_length, save_strategy="steps", save_steps=settings.train.save_steps,
        save_total_limit=1, logging_steps=1, report_to="none", seed=settings.seed,
        gradient_checkpointing=settings.gradient_checkpointing, **device_args(settings.bf16),
    )
    records = [{**r, "chat_template_kwargs": settings.chat_template_kwargs} for r in preference_records(train_pairs)]
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(records),
                            processing_class=tokenizer, callbacks=wandb_callbacks("persona_rm"))
    metrics_on_progress_bar(trainer, ["loss", "accuracy", "margin"])
    resume = Resume.latest(checkpoints)
    with quiet_transformers():
        trainer.train(resume_from_checkpoint=str(resume.checkpoint) if resume.checkpoint else None)

    with quiet_transformers(), atomic_dir(out) as staging:
        trainer.save_model(str(staging))
        tokenizer.save_pretrained(staging)
        trained = PersonaRewardModel(staging, device=resolve_device("auto"),
                                     chat_template_kwargs=settings.chat_template_kwargs)
        metrics = {
            "held_out": pair_accuracy(trained, eval_pairs),
            "train": pair_accuracy(trained, train_pairs),
            "training": {"steps": trainer.state.global_step, "resumed_from_step": resume.step,
                         "steps_run": trainer.state.global_step - resume.step,
                         "train_pairs": train_pairs.height, "held_out_pairs": eval_pairs.height,
                         # RewardTrainer drops pairs longer than train.persona_rm.max_length.
                         "train_pairs_within_max_length": len(trainer.train_dataset),
                         "held_out_contexts": sorted(held_out)},
        }
        write_json(metrics, staging / "metrics.json")
    shutil.rmtree(checkpoints, ignore_errors=True)  # the finished model supersedes them
    return dir_artifact(out)


def pair_accuracy(model: PersonaRewardModel, pairs: pl.DataFrame, confidence: float = 0.95) -> dict:
    """Share of pairs where the chosen reply outscores the rejected one (ties count as wrong), with
    Wilson intervals overall and per persona, and the distribution of reward margins."""
    if pairs.is_empty():
        return {"accuracy": proportion(0, 0, confidence), "by_persona": {}, "margin": describe([]),
                "margin_histogram": {"edges": [], "counts": []}}
    prompts = pairs["prompt"].to_list()
    chosen = model.score(prompts, pairs["chosen"].to_list())
    rejected = model.score(prompts, pairs["rejected"].to_list())
    scored = pairs.select("persona").with_columns(margin=pl.Series([c - r for c, r in zip(chosen, rejected, strict=True)]))
    by_persona = {
        persona: proportion(int((group["margin"] > 0).sum()), group.height, confidence)
        for (persona,), group in sorted(scored.group_by("persona"), key=lambda item: item[0])
    }
    margins = scored["margin"].to_list()
    return {"accuracy": proportion(int((scored["margin"] > 0).sum()), scored.height, confidence),
            "by_persona": by_persona, "margin": describe(margins), "margin_histogram": histogram(margins)}
