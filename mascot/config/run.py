"""The whole run: `RunConfig` validates one `configs/*.yaml`, section by section.

Model references are a Hugging Face id or a local folder (`Qwen/Qwen3-8B`, `/models/speaker`), or
one of the tiny offline models built by `mascot.train.tiny` (`tiny:lm`, `tiny:rm`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from mascot.config.backends import BackendConfig
from mascot.config.base import TINY_MODELS, ConfigPath, RunName, Section
from mascot.config.chat import ChatConfig
from mascot.config.data import DataConfig
from mascot.config.evaluation import EvalConfig
from mascot.config.gpus import GpuMap
from mascot.config.plan import PlanConfig
from mascot.config.stage1 import BeforeAfterConfig, SpeakerConfig, Stage1Config
from mascot.config.stage2 import DirectorConfig, DirectorDPOConfig, DirectorEvalConfig, Stage2Config
from mascot.config.training import RewardModelConfig, SFTPolicyConfig, TrainerConfig
from mascot.yamlio import FieldError


class RunSection(Section):
    name: RunName = Field(description="Run name; artifacts go to `<output_dir>/<name>/`.")
    seed: int = Field(default=0, ge=0, description="Seed for sampling, subsampling and training.")
    output_dir: ConfigPath = Field(default=Path("runs"), description="Parent folder of run directories.")


class TrainConfig(Section):
    persona_rm: RewardModelConfig = Field(description="The persona reward model (Stage 1).")
    speaker: SpeakerConfig = Field(description="The GRPO Speaker (Stage 1).")
    before_after: BeforeAfterConfig = Field(default_factory=BeforeAfterConfig,
                                            description="The Speaker against its base policy on held-out prompts.")
    group_rm: RewardModelConfig | None = Field(default=None, description="The group reward model (Stage 2).")
    director: DirectorConfig | None = Field(default=None, description="The GRPO Director (Stage 2, the paper's "
                                            "method).")
    director_dpo: DirectorDPOConfig | None = Field(default=None, description="The DPO Director (Stage 2, an "
                                                   "optional alternative to GRPO).")
    director_eval: DirectorEvalConfig = Field(default_factory=DirectorEvalConfig,
                                              description="The Director against its base policy on held-out states.")
    sft: SFTPolicyConfig | None = Field(default=None, description="The evaluation's SFT baseline: the base Speaker "
                                        "fine-tuned on Stage 1's best-judged candidates of training contexts.")

    @property
    def trainers(self) -> dict[str, TrainerConfig]:
        named = {"persona_rm": self.persona_rm, "speaker": self.speaker, "group_rm": self.group_rm,
                 "director": self.director, "director_dpo": self.director_dpo, "sft": self.sft}
        return {name: trainer for name, trainer in named.items() if trainer is not None}


class TinyModelSpec(Section):
    """Shape of the locally built tiny Qwen3 models (offline profile and tests)."""

    vocab_size: int = Field(default=2048, ge=300, le=65536, description="BPE vocabulary size to train.")
    hidden_size: int = Field(default=64, ge=8, description="Hidden width.")
    intermediate_size: int = Field(default=192, ge=8, description="MLP width.")
    num_hidden_layers: int = Field(default=2, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(default=2, ge=1, description="Key/value heads (grouped-query attention).")
    max_position_embeddings: int = Field(default=2048, ge=64, description="Longest sequence.")
    warm_start_steps: int = Field(default=600, ge=0, description="Language-model steps on the sample dialogues.")
    seed: int = Field(default=0, ge=0, description="Seed for weight initialisation and the warm-start batch order.")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelSpec:
        if self.hidden_size % self.num_attention_heads:
            raise FieldError("num_attention_heads", f"hidden_size ({self.hidden_size}) must be divisible by "
                                                    f"num_attention_heads ({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise FieldError("num_key_value_heads", f"num_attention_heads ({self.num_attention_heads}) must be "
                                                    f"divisible by num_key_value_heads ({self.num_key_value_heads})")
        return self


class TrackingConfig(Section):
    wandb_project: str = Field(default="mascot", description="wandb project name.")
    wandb_mode: Literal["online", "offline", "disabled"] = Field(default="offline", description="wandb mode.")


class RunnerConfig(Section):
    """Where a flow run's shards run: threads of the flow's process (the default), or the worker processes of a
    local Dask or Ray cluster."""

    kind: Literal["threads", "dask", "ray"] = Field(default="threads", description="threads: one process; dask: "
                                                    "worker processes of a local Dask cluster (the dask extra); ray: "
                                                    "worker processes of a local Ray instance (the ray extra).")
    workers: int = Field(default=2, ge=1, description="dask, ray: worker processes; on ray, also the shards "
                         "that run at once.")
    threads_per_worker: int = Field(default=16, ge=1, description="dask: threads per worker; they mostly wait on "
                                    "the backends' limits, which hold for all workers together. Ray runs one shard "
                                    "at a time in each worker.")


class CacheConfig(Section):
    dir: ConfigPath | None = Field(default=None, description="Request and model cache (default $MASCOT_CACHE_DIR "
                                   "or ~/.cache/mascot).")

    @property
    def root(self) -> Path:
        return self.dir or Path(os.environ.get("MASCOT_CACHE_DIR", "~/.cache/mascot")).expanduser()

    @property
    def requests(self) -> Path:
        """The request cache every backend of the run shares."""
        return self.root / "requests.sqlite"


class RunConfig(Section):
    run: RunSection
    data: DataConfig
    generation: BackendConfig = Field(description="Backend that samples Speaker candidates.")
    stage1: Stage1Config
    stage2: Stage2Config | None = Field(default=None, description="Stage 2: episodes, group judge, Director.")
    eval: EvalConfig | None = Field(default=None, description="The evaluation: MASCOT against named baselines.")
    chat: ChatConfig = Field(default_factory=ChatConfig, description="Talking to the trained group (mascot chat).")
    train: TrainConfig
    tiny: TinyModelSpec | None = Field(default=None, description="Needed when any model is 'tiny:lm' or 'tiny:rm'.")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="Where the shards of a flow run run.")
    gpus: GpuMap | None = Field(default=None, description="Which GPUs train and which serve (deployments/README.md); "
                                "left out: no check of the machine's GPUs beyond bf16's.")
    plan: PlanConfig = Field(default_factory=PlanConfig, description="List prices and rates for `mascot plan`.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.tiny is None:
            for loc, ref in self.model_refs().items():
                if ref in TINY_MODELS:
                    raise FieldError(loc, f"{ref} is a tiny offline model, so the config needs a 'tiny' section "
                                          "(the shape of the tiny models to build)")
        if self.stage2 is not None:
            for name in ("group_rm", "director"):
                if getattr(self.train, name) is None:
                    raise FieldError(("train", name), f"Stage 2 (the 'stage2' section) trains train.{name}, "
                                                      "so the config needs that section")
        if self.eval is not None and self.stage2 is None:
            raise FieldError(("eval",), "the evaluation plays the trained Speaker and Director, so the config needs "
                                        "a 'stage2' section too")
        if self.eval is not None and "sft" in self.eval.systems and self.train.sft is None:
            raise FieldError(("eval", "systems"), "the 'sft' baseline is trained by train.sft, which the config does "
                                                  "not have: add that section (see configs/tiny.yaml) or drop 'sft'")
        if self.eval is not None and self.stage2 is not None and self.eval.block_tokens is not None:
            turns = self.eval.block_turns or self.stage2.episodes.block_turns
            if self.eval.block_tokens % turns:
                raise FieldError(("eval", "block_tokens"), (
                    f"a group's {turns} companion turns per block (eval.block_turns, else stage2.episodes.block_turns) "
                    f"share the block's {self.eval.block_tokens} tokens equally, so it must be a multiple of {turns}, "
                    f"e.g. {turns * max(1, self.eval.block_tokens // turns)}"))
        if self.eval is not None:
            sets = ["held_out", "all", *(f"{c.source}:{c.split}" for c in self.data.held_out if self.eval.out_of_domain)]
            if self.eval.primary.eval_set not in sets:
                raise FieldError(("eval", "primary", "eval_set"), (
                    f"'{self.eval.primary.eval_set}' is not an evaluation set of this config; expected one of "
                    f"{', '.join(sets)} (a data.held_out corpus as '<source>:<split>', with eval.out_of_domain on)"))
        if self.gpus is not None and len(self.gpus.train) > 1:
            for name, trainer in self.train.trainers.items():
                if trainer.accelerate_config is None and not trainer.use_cpu:
                    raise FieldError(("train", name), f"gpus.train lists {len(self.gpus.train)} GPUs, so this step "
                                     "would see them all and train on one (TRL refuses nn.DataParallel); give it "
                                     "accelerate_config: ../deployments/accelerate/multi_gpu.yaml, or list one GPU "
                                     "in gpus.train")
        if self.eval is not None and self.eval.training_seeds > 1:
            roles = [("stage2", "speaker"), ("eval", "speaker"), ("eval", "director")]
            for section, role in roles:
                backend = getattr(getattr(self, section), role)
                if backend is not None and backend.kind == "openai" and not backend.load_adapter:
                    raise FieldError((section, role, "load_adapter"), (
                        f"eval.training_seeds is {self.eval.training_seeds}, so each training seed's adapter must "
                        f"reach the server, but {section}.{role} names a module served by hand, which is one adapter; "
                        "set load_adapter: true (the flow loads each seed's adapter under its own name), leave the "
                        "role in this process, or set eval.training_seeds: 1"))
        for trainer in self.train.trainers.values():  # a trainer without its own seed takes the run's
            if trainer.seed is None:
                trainer.seed = self.run.seed
        return self

    def model_refs(self) -> dict[tuple, str]:
        """Every model reference in the config, by its YAML path."""
        refs: dict[tuple, str] = {("generation", "model"): self.generation.model}
        for index, judge in enumerate(self.stage1.judges):
            if judge.backend is not None:
                refs[("stage1", "judges", index, "backend", "model")] = judge.backend.model
        if self.stage2 is not None:
            for role in ("director", "speaker", "user"):
                if (backend := getattr(self.stage2, role)) is not None:
                    refs[("stage2", role, "model")] = backend.model
            for index, judge in enumerate(self.stage2.judges):
                if judge.backend is not None:
                    refs[("stage2", "judges", index, "backend", "model")] = judge.backend.model
        if self.eval is not None:
            for role in ("director", "director_dpo", "speaker", "sft"):
                if (backend := getattr(self.eval, role)) is not None:
                    refs[("eval", role, "model")] = backend.model
            for panel in ("judges", "group_judges"):
                for index, judge in enumerate(getattr(self.eval, panel)):
                    if judge.backend is not None:
                        refs[("eval", panel, index, "backend", "model")] = judge.backend.model
            if self.eval.pairwise.backend is not None:
                refs[("eval", "pairwise", "backend", "model")] = self.eval.pairwise.backend.model
        for role in ("speaker", "director"):
            if (backend := getattr(self.chat, role)) is not None:
                refs[("chat", role, "model")] = backend.model
        for name, trainer in self.train.trainers.items():
            refs[("train", name, "model")] = trainer.model
        return refs

    @property
    def training_seeds(self) -> int:
        """Training runs of the Speaker's GRPO and the GRPO Director (eval.training_seeds; 1 without an evaluation)."""
        return self.eval.training_seeds if self.eval is not None else 1

    @property
    def run_dir(self) -> Path:
        return self.run.output_dir / self.run.name

    def renamed(self, name: str) -> RunConfig:
        """The same config for another run name (`--run-name`); the name is validated like the file's."""
        return self.model_copy(update={"run": RunSection.model_validate({**self.run.model_dump(), "name": name})})
