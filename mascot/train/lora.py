"""LoRA adapters for the Speaker and Director policies (PEFT), and how much of a model they train."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mascot.config import LoraConfig


def peft_lora_config(lora: LoraConfig, task_type: str = "CAUSAL_LM"):
    """The PEFT config for a policy's `lora` section: rank, alpha and dropout on the named projections."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=list(lora.target_modules), bias="none", task_type=task_type)


def normalize_adapter_config(folder: Path) -> None:
    """Write a saved adapter's `target_modules` sorted, so that the same training saves the same bytes.

    PEFT keeps `target_modules` as a set and writes it in the set's order, which changes from one
    process to the next (Python salts string hashes). The adapter's files are part of every request's
    cache key (`mascot.llm.transformers_backend.adapter_fingerprint`), so a rerun that trained the
    very same adapter would otherwise pay again for the requests it had answered.
    """
    path = Path(folder) / "adapter_config.json"
    config = json.loads(path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class TrainableParameters:
    trainable: int
    total: int

    @property
    def fraction(self) -> float:
        return self.trainable / self.total

    def __str__(self) -> str:
        return f"{self.trainable:,} of {self.total:,} parameters trainable ({self.fraction:.3%})"


def count_trainable_parameters(model) -> TrainableParameters:
    """Counts as PEFT's `print_trainable_parameters` does: the total includes the adapter."""
    trainable = total = 0
    for parameter in model.parameters():
        total += parameter.numel()
        trainable += parameter.numel() if parameter.requires_grad else 0
    return TrainableParameters(trainable=trainable, total=total)
