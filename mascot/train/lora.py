"""LoRA adapters for the Speaker and Director policies (PEFT), and how much of a model they train."""

from __future__ import annotations

from dataclasses import dataclass

from mascot.config import LoraConfig


def peft_lora_config(lora: LoraConfig, task_type: str = "CAUSAL_LM"):
    """The PEFT config for a policy's `lora` section: rank, alpha and dropout on the named projections."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=list(lora.target_modules), bias="none", task_type=task_type)


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
