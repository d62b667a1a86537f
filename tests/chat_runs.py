"""A run directory to talk to, made in seconds: the tiny profile's config and manifest, with a Speaker and a
Director adapter recorded as Stage 1 and Stage 2 record theirs.

The adapters are LoRA adapters as PEFT initialises them (B = 0), so they answer as the base tiny model
does; everything `mascot chat` reads (the manifest's config, the recorded artifacts and their hashes, the
adapters on their base model) is as a trained run has it, without minutes of training.
"""

from __future__ import annotations

from pathlib import Path

from stage1_runs import write_config

from mascot.artifacts import RunDir, dir_artifact
from mascot.config import load_config
from mascot.train.lora import normalize_adapter_config, peft_lora_config


def untrained_adapter(base: Path, lora, out: Path) -> Path:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), peft_lora_config(lora))
    model.save_pretrained(out)
    normalize_adapter_config(out)
    return out


def group_run(folder: Path, tiny_models, name: str = "chat") -> Path:
    """`folder`/runs/`name`: a run directory with a Speaker and a Director that `mascot chat` can load."""
    config = load_config(write_config(folder, name))
    run = RunDir(config.run_dir)
    run.start(config, folder / f"{name}.yaml", stage="stage2", until="director")
    for artifact, policy in (("stage1/speaker", config.train.speaker), ("stage2/director", config.train.director)):
        path = untrained_adapter(tiny_models.lm, policy.lora, run.root / artifact)
        run.record({artifact: dir_artifact(path)})
    return run.root
