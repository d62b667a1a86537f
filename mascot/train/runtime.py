"""What every trainer here shares: device and precision, where checkpoints go and how a run resumes
from them, and logging to the flow's wandb run."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from mascot.artifacts import content_sha256
from mascot.config import BackendConfig, SamplingParams, TrainerConfig
from mascot.torch_runtime import cuda_device, quiet_transformers, require_torch
from mascot.tracking import active_run

# TRL 1.16 itself still uses transformers' deprecated `gradient_checkpointing` names; the warning
# concerns TRL's code, not anything a user of this project can change.
warnings.filterwarnings("ignore", message=r".*gradient_checkpointing` is deprecated", category=FutureWarning)


class TrainingSetupError(RuntimeError):
    """The configured training cannot run here: bf16 without a GPU, no pairs to train on, ..."""


def trainer_device(config: TrainerConfig) -> str:
    """Where a trainer runs, and where its model is scored afterwards: this process's GPU (`cuda:{LOCAL_RANK}` under
    a launch) unless use_cpu or none is visible. An explicit index, so that reward-model scorers and policy snapshots
    loaded in other threads land on the same GPU as the trainer."""
    return cuda_device() if require_torch().cuda.is_available() and not config.use_cpu else "cpu"


def adapter_backend(trainer: TrainerConfig, adapter: Path, params: SamplingParams) -> BackendConfig:
    """A trained adapter on `trainer`'s base model, served in this process, sampling with `params`."""
    return BackendConfig(kind="transformers", model=trainer.model, adapter=adapter, device=trainer_device(trainer),
                         params=params)


def device_args(config: TrainerConfig) -> dict:
    """TrainingArguments for this machine: the CPU needs use_cpu=True and bf16=False."""
    cuda = trainer_device(config).startswith("cuda")
    if config.bf16 and not cuda:
        raise TrainingSetupError("bf16 is true but no CUDA GPU is visible; set bf16: false in the trainer's "
                                 "section to train in float32 on the CPU (configs/tiny.yaml does)")
    return {"use_cpu": not cuda, "bf16": config.bf16}


def checkpoint_dir(out: Path, *inputs: BaseModel) -> Path:
    """Checkpoints of training `out` from these inputs (config, artifacts): a retry of the same training
    resumes there, while changed inputs get a folder of their own and start afresh."""
    key = content_sha256([item.model_dump(mode="json") for item in inputs])
    return out.parent / "checkpoints" / f"{out.name}-{key[:16]}"


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


def train_resuming(trainer, checkpoints: Path) -> Resume:
    """Train from the newest complete checkpoint in `checkpoints`, or from the start; returns where it began."""
    resume = Resume.latest(checkpoints)
    with quiet_transformers():
        trainer.train(resume_from_checkpoint=str(resume.checkpoint) if resume.checkpoint else None)
    return resume


def wandb_callbacks(prefix: str) -> list:
    """Send a trainer's logs to the active wandb run (the flow's), as `train/<prefix>/<metric>`.

    Without a prefix the reward model's and the Speaker's `loss`, `learning_rate`, ... would land
    on the same charts. Returns no callback when there is no active run.
    """
    if active_run() is None:
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
