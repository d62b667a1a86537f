"""DPO policies: TRL's DPOTrainer with a LoRA adapter, on conversational preference pairs.

Stage 2 offers it for the Director as an alternative to GRPO (not the paper's method): the pairs
are directives from the branching generator, the better branch's first directive chosen. The saved
folder is a PEFT adapter with the tokenizer, like the GRPO trainer's, so both load the same way.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json
from mascot.config import DirectorDPOConfig
from mascot.torch_runtime import quiet_transformers, require_torch
from mascot.train.lora import count_trainable_parameters, normalize_adapter_config, peft_lora_config
from mascot.train.runtime import (
    TrainingSetupError,
    device_args,
    metrics_on_progress_bar,
    train_resuming,
    wandb_callbacks,
)


def train_dpo_policy(config: DirectorDPOConfig, records: list[dict[str, Any]], out: Path, checkpoints: Path, *,
                     name: str, details: dict[str, Any] | None = None) -> Artifact | None:
    """DPO on `records` (TRL's conversational preference format with a prompt), resuming from `checkpoints`."""
    require_torch()
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    if not records:
        raise TrainingSetupError(f"no preference pairs to train {name} on with DPO")
    args = DPOConfig(
        output_dir=str(checkpoints), learning_rate=config.learning_rate, num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=config.gradient_accumulation_steps,
        beta=config.beta, max_length=config.max_length, save_strategy="steps", save_steps=config.save_steps,
        save_total_limit=1, logging_steps=1, report_to="none", seed=config.seed,
        gradient_checkpointing=config.gradient_checkpointing, **device_args(config),
        model_init_kwargs={"dtype": "bfloat16" if config.bf16 else "float32"},
    )
    records = [{**r, "chat_template_kwargs": config.chat_template_kwargs} for r in records] \
        if config.chat_template_kwargs else records
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(config.model)
        trainer = DPOTrainer(model=config.model, args=args, train_dataset=Dataset.from_list(records),
                             processing_class=tokenizer, peft_config=peft_lora_config(config.lora),
                             callbacks=wandb_callbacks(name))
    metrics_on_progress_bar(trainer, ["loss", "rewards/accuracies", "rewards/margins"])
    parameters = count_trainable_parameters(trainer.model)
    resume = train_resuming(trainer, checkpoints)
    if not trainer.is_world_process_zero():
        return None  # a later process of an `accelerate launch` (mascot.train.launch): the first one writes

    with quiet_transformers(), atomic_dir(out) as staging:
        trainer.save_model(str(staging))
        normalize_adapter_config(staging)
        tokenizer.save_pretrained(staging)
        write_json({
            "method": "dpo",
            "trainable_parameters": {"trainable": parameters.trainable, "total": parameters.total,
                                     "fraction": parameters.fraction},
            "training": {"steps": trainer.state.global_step, "resumed_from_step": resume.step,
                         "steps_run": trainer.state.global_step - resume.step, "pairs": len(records),
                         **(details or {})},
            "log_history": [entry for entry in trainer.state.log_history if "loss" in entry],
        }, staging / "metrics.json")
    shutil.rmtree(checkpoints, ignore_errors=True)
    return dir_artifact(out)
