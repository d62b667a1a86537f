"""What every trainer here shares: device and precision, checkpoint resume, and wandb logging."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mascot.config import RunConfig
from mascot.llm.transformers_backend import require_torch

# TRL 1.16 itself still uses transformers' deprecated `gradient_checkpointing` names; the warning
# concerns TRL's code, not anything a user of this project can change.
warnings.filterwarnings("ignore", message=r".*gradient_checkpointing` is deprecated", category=FutureWarning)


class TrainingSettings(BaseModel):
    """What decides any trained model here (and so its task's cache key); each trainer adds its own."""

    base_model: str
    held_out_fraction: float
    seed: int
    bf16: bool
    gradient_checkpointing: bool
    chat_template_kwargs: dict[str, Any]

    @staticmethod
    def shared(config: RunConfig, base_model: str) -> dict[str, Any]:
        """The shared fields from a run config; `base_model` is the model reference resolved to a path."""
        return {"base_model": base_model, "held_out_fraction": config.train.held_out_fraction, "seed": config.run.seed,
                "bf16": config.train.bf16, "gradient_checkpointing": config.train.gradient_checkpointing,
                "chat_template_kwargs": config.generation.params.chat_template_kwargs}


class TrainingSetupError(RuntimeError):
    """The configured training cannot run here: bf16 without a GPU, no pairs to train on, ..."""


def device_args(bf16: bool) -> dict:
    """TrainingArguments for this machine: the CPU needs use_cpu=True and bf16=False."""
    torch = require_torch()
    cuda = torch.cuda.is_available()
    if bf16 and not cuda:
        raise TrainingSetupError("train.bf16 is true but no CUDA GPU is visible; set train.bf16: false "
                                 "to train in float32 on the CPU (configs/tiny.yaml does)")
    return {"use_cpu": not cuda, "bf16": bf16}


@dataclass(frozen=True)
class Resume:
    """Where a training run starts: a checkpoint folder and its step, or the beginning."""

    checkpoint: Path | None
    step: int

    @classmethod
    def latest(cls, folder: Path) -> Resume:
        """The newest complete checkpoint in `folder` (Trainer's `checkpoint-<step>` folders)."""
        steps = []
        for candidate in folder.glob("checkpoint-*") if folder.exists() else []:
            match = re.fullmatch(r"checkpoint-(\d+)", candidate.name)
            # trainer_state.json is written last: a checkpoint killed mid-save lacks it.
            if match and (candidate / "trainer_state.json").exists():
                steps.append((int(match.group(1)), candidate))
        if not steps:
            return cls(None, 0)
        step, checkpoint = max(steps)
        return cls(checkpoint, step)


def wandb_callbacks(prefix: str) -> list:
    """Send a trainer's logs to the active wandb run (the flow's), as `train/<prefix>/<metric>`.

    Without a prefix the reward model's and the Speaker's `loss`, `learning_rate`, ... would land
    on the same charts. Returns no callback when there is no active run.
    """
    try:
        import wandb
    except ImportError:
        return []
    if wandb.run is None:
        return []
    from transformers.integrations import WandbCallback

    class PrefixedWandbCallback(WandbCallback):
        def on_log(self, args, state, control, model=None, logs=None, **kwargs):
            prefixed = {f"{prefix}/{key}": value for key, value in (logs or {}).items()}
            super().on_log(args, state, control, model=model, logs=prefixed, **kwargs)

    return [PrefixedWandbCallback()]


def metrics_on_progress_bar(trainer, keys: list[str]) -> None:
    """Show the latest values of `keys` on the trainer's progress bar instead of printing every log.

    With a log every step, transformers' default prints one dict per step; the bar's postfix
    keeps the console to one line while wandb and `metrics.json` keep the full record.
    """
    from transformers.trainer_callback import ProgressCallback

    class MetricsProgressCallback(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and self.training_bar is not None and logs:
                shown = {key: f"{logs[key]:.3g}" for key in keys if isinstance(logs.get(key), int | float)}
                if shown:
                    self.training_bar.set_postfix(shown, refresh=False)

    if trainer.pop_callback(ProgressCallback) is not None:  # absent when tqdm is disabled
        trainer.add_callback(MetricsProgressCallback())
