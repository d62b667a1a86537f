"""SFT policies: TRL's SFTTrainer with a LoRA adapter, on conversational prompt-completion examples.

The evaluation's SFT baseline is the base Speaker fine-tuned this way on Stage 1's best-judged
candidates. The loss is on the completion only (TRL's default for prompt-completion data), so the
adapter learns the replies, not the prompts. The saved folder is a PEFT adapter with the tokenizer,
like the GRPO and DPO trainers', so all three load the same way.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mascot.artifacts import Artifact, atomic_dir, dir_artifact, write_json
from mascot.config.training import SFTPolicyConfig
from mascot.torch_runtime import quiet_transformers, require_torch
from mascot.train.lora import count_trainable_parameters, normalize_adapter_config, peft_lora_config
from mascot.train.runtime import (
    TrainingSetupError,
    device_args,
    metrics_on_progress_bar,
    train_resuming,
    wandb_callbacks,
)


def train_sft_policy(config: SFTPolicyConfig, records: list[dict[str, Any]], out: Path, checkpoints: Path, *,
                     name: str, details: dict[str, Any] | None = None) -> Artifact | None:
    """SFT on `records` ({"prompt": messages, "completion": [assistant message]}), resuming from `checkpoints`."""
    require_torch()
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    if not records:
        raise TrainingSetupError(f"no examples to fine-tune {name} on")
    args = SFTConfig(
        output_dir=str(checkpoints), learning_rate=config.learning_rate, num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=config.gradient_accumulation_steps,
        max_length=config.max_length, save_strategy="steps", save_steps=config.save_steps, save_total_limit=1,
        logging_steps=1, report_to="none", seed=config.seed, gradient_checkpointing=config.gradient_checkpointing,
        **device_args(config), model_init_kwargs={"dtype": "bfloat16" if config.bf16 else "float32"},
    )
    records = [{**r, "chat_template_kwargs": config.chat_template_kwargs} for r in records] \
        if config.chat_template_kwargs else records
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(config.model)
        trainer = SFTTrainer(model=config.model, args=args, train_dataset=Dataset.from_list(records),
                             processing_class=tokenizer, peft_config=peft_lora_config(config.lora),
                             callbacks=wandb_callbacks(name))
    metrics_on_progress_bar(trainer, ["loss", "mean_token_accuracy"])
    parameters = count_trainable_parameters(trainer.model)
    resume = train_resuming(trainer, checkpoints)
    if not trainer.is_world_process_zero():
        return None  # a later process of an `accelerate launch` (mascot.train.launch): the first one writes

    with quiet_transformers(), atomic_dir(out) as staging:
        trainer.save_model(str(staging))
        normalize_adapter_config(staging)
        tokenizer.save_pretrained(staging)
        write_json({
            "method": "sft",
            "trainable_parameters": {"trainable": parameters.trainable, "total": parameters.total,
                                     "fraction": parameters.fraction},
            "training": {"steps": trainer.state.global_step, "resumed_from_step": resume.step,
                         "steps_run": trainer.state.global_step - resume.step, "examples": len(records),
                         **(details or {})},
            "log_history": [entry for entry in trainer.state.log_history if "loss" in entry],
        }, staging / "metrics.json")
    shutil.rmtree(checkpoints, ignore_errors=True)
    return dir_artifact(out)
