"""Trainer configs, shaped like TRL's: one base with what every trainer reads, one class per trainer.

Each trainer's section holds everything its trainer reads (base model, precision, LoRA, vLLM), so
a training task takes its section and nothing else, and the section is its cache key. Fields are
grouped as TRL groups them in `reward_config.py` and `grpo_config.py`; each description names
the TRL or `TrainingArguments` field it sets where the name differs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from mascot.config.base import ConfigPath, ModelRef, Section
from mascot.yamlio import FieldError


class LoraConfig(Section):
    r: int = Field(default=16, ge=1, description="LoRA rank.")
    alpha: int = Field(default=32, ge=1, description="LoRA scaling numerator.")
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="Module names that get adapters.",
    )


class TrainerConfig(Section):
    """What every trainer reads. `seed` left out takes `run.seed`."""

    # Parameters that control the model
    model: ModelRef = Field(description="Base model: a Hugging Face id, a local folder, or tiny:lm / tiny:rm.")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Chat-template variables, e.g. `{enable_thinking: false}` for Qwen3.")
    bf16: bool = Field(default=False, description="Train in bfloat16 (needs a CUDA GPU).")
    use_cpu: bool = Field(default=False, description="Train on the CPU even when a GPU is visible.")
    gradient_checkpointing: bool = Field(default=True, description="Recompute activations to save memory.")
    accelerate_config: ConfigPath | None = Field(
        default=None, description="Train over several processes, one per GPU: `accelerate launch` with this config "
        "file (deployments/accelerate/multi_gpu.yaml). Each process takes batch_size examples per step. Left "
        "out: train in the flow's process.")
    python: ConfigPath | None = Field(
        default=None, description="The Python of another environment to train in: the step runs in a process of "
        "that interpreter (under accelerate_config's launch, if set), which imports this checkout's mascot. For "
        "use_vllm, whose vLLM cannot install beside the flows' prefect: the vLLM environment with the train extra "
        "(deployments/README.md). Left out: this environment.")

    # Parameters that control the training
    learning_rate: float = Field(default=1e-5, gt=0, description="Peak learning rate.")
    batch_size: int = Field(default=8, ge=1, description="Examples per device per step (per_device_train_batch_size).")
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Steps accumulated per update.")
    save_steps: int = Field(default=100, ge=1, description="Checkpoint every this many steps (the resume point).")
    seed: int | None = Field(default=None, ge=0, description="Seed of the model head, data order and sampling "
                             "(default: run.seed).")

    def reseeded(self, training_seed: int) -> TrainerConfig:
        """This trainer for training seed `training_seed` of eval.training_seeds: its seed offset by it (seed 0 is
        this trainer itself, so one training run trains as before)."""
        if training_seed == 0:
            return self
        return self.model_copy(update={"seed": (self.seed or 0) + training_seed})

    @model_validator(mode="after")
    def _precision_fits_device(self) -> TrainerConfig:
        if self.bf16 and self.use_cpu:
            raise FieldError("bf16", "bf16 needs a CUDA GPU, but use_cpu is true; set bf16: false to train in "
                                     "float32 on the CPU")
        return self


class RewardModelConfig(TrainerConfig):
    """TRL's RewardTrainer: a scalar head on the base model, trained in full on preference pairs."""

    # Parameters that control the data preprocessing
    max_length: int = Field(default=1024, ge=16, description="Longest prompt + reply in tokens; longer pairs "
                            "are dropped.")

    # Parameters that control the training
    epochs: float = Field(default=1.0, gt=0, description="Passes over the training pairs (num_train_epochs).")

    # Parameters that control the evaluation
    accuracy_sample_pairs: int = Field(
        default=2000, ge=1, description="Training pairs scored after training, a seeded sample of at most this "
        "many: their accuracy (an overfitting check; at 2000 its Wilson 95% interval is at most +-2.2 points) and "
        "the scale of their scores, which rewards are standardised by. Scoring every training pair took hours for "
        "the paper's persona RM. The held-out pairs are always scored whole.")


class RewardWeights(Section):
    """A GRPO policy's reward terms, one weight each; the reward is their weighted sum."""

    @model_validator(mode="after")
    def _something_rewarded(self) -> RewardWeights:
        if not any(self.model_dump().values()):
            raise ValueError("every reward weight is 0, so GRPO would have nothing to learn from; give at least "
                             "one a positive weight")
        return self


class GRPOPolicyConfig(TrainerConfig):
    """TRL's GRPOTrainer on a LoRA adapter: a policy rewarded by reward functions."""

    # Parameters whose default values are overridden
    save_steps: int = Field(default=50, ge=1, description="Checkpoint every this many steps (the resume point).")

    # Parameters that control the model
    lora: LoraConfig = Field(default_factory=LoraConfig, description="The adapter that is trained.")

    # Parameters that control generation
    num_generations: int = Field(default=8, ge=2, description="Completions sampled per prompt (the GRPO group).")
    max_completion_length: int = Field(default=256, ge=1, description="Longest completion, in tokens.")
    temperature: float = Field(default=1.0, gt=0, le=2.0, description="Sampling temperature of the rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1.0, description="Nucleus sampling mass of the rollouts.")
    top_k: int | None = Field(default=None, ge=1, description="Sample the rollouts among the k likeliest tokens "
                              "(unset: all), as the served candidates are sampled.")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, description="Drop rollout tokens less likely than "
                                "min_p times the likeliest (unset: none).")

    # Parameters that control generation acceleration powered by vLLM
    use_vllm: bool = Field(default=False, description="Generate rollouts with vLLM in the training process (GPU; its environment: deployments/README.md).")
    vllm_mode: Literal["colocate", "server"] = Field(default="colocate", description="TRL's vLLM mode.")
    vllm_gpu_memory_utilization: float = Field(
        default=0.3, gt=0, le=1.0, description="colocate: the share of the training GPU that TRL's vLLM takes, weights "
        "and KV cache together (TRL's default); the policy, its optimizer states and the reward models need the rest.")
    vllm_enable_sleep_mode: bool = Field(default=False, description="colocate: offload vLLM's weights and cache "
                                         "during the optimizer step (less peak memory, slower steps).")
    vllm_max_model_length: int | None = Field(default=None, ge=16, description="colocate: vLLM's context window "
                                              "(longest prompt + max_completion_length); null: the model's, whose "
                                              "KV cache reservation is far larger than the rollouts need.")

    # Parameters that control the training
    max_steps: int = Field(default=200, ge=1, description="GRPO optimisation steps.")
    beta: float = Field(default=0.04, ge=0, description="KL penalty towards the base policy (0 turns it off).")

    @model_validator(mode="after")
    def _groups_fit_batches(self) -> GRPOPolicyConfig:
        generation_batch = self.batch_size * self.gradient_accumulation_steps
        if generation_batch % self.num_generations:
            raise FieldError("num_generations", f"batch_size x gradient_accumulation_steps ({generation_batch}) must "
                             f"be divisible by num_generations ({self.num_generations}): GRPO scores whole groups")
        return self


class SFTPolicyConfig(TrainerConfig):
    """TRL's SFTTrainer on a LoRA adapter: a policy fine-tuned on chosen replies (the loss on the reply only)."""

    lora: LoraConfig = Field(default_factory=LoraConfig, description="The adapter that is trained.")
    learning_rate: float = Field(default=2e-5, gt=0, description="Peak learning rate.")
    epochs: float = Field(default=1.0, gt=0, description="Passes over the examples (num_train_epochs).")
    max_length: int = Field(default=1024, ge=16, description="Longest prompt + reply in tokens; longer examples are "
                            "truncated.")
