"""Stage 1 in a config: candidates, judging and pairs; the Speaker's rewards; the before/after check."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mascot.config.backends import JudgeConfig
from mascot.config.base import ConfigPath, Section
from mascot.config.training import GRPOPolicyConfig, RewardWeights
from mascot.yamlio import FieldError


class Stage1Config(Section):
    k: int = Field(default=8, ge=2, description="Candidates sampled per (context, persona) query.")
    margin: float = Field(default=0.5, ge=0.0, description="Minimum overall-score gap for a preference pair.")
    shard_size: int = Field(default=32, ge=1, description="Queries per cached sampling/judging shard.")
    max_pairs_per_query: int | None = Field(default=None, ge=1, description="Optional cap on pairs per query.")
    judges: list[JudgeConfig] = Field(min_length=1, description="Judge panel scoring every candidate.")
    rubric: ConfigPath = Field(description="Rubric YAML with the criteria and their anchors.")
    aggregation: Literal["mean", "zscore"] = Field(
        default="mean", description="How a panel's overall scores combine: mean, or mean of per-judge z-scores."
    )
    max_judge_failure_rate: float = Field(
        default=0.1, ge=0.0, le=1.0, description="Fail the run when more judgments than this share fail."
    )

    @model_validator(mode="after")
    def _judge_names_unique(self) -> Stage1Config:
        labels = [j.label for j in self.judges]
        for index, label in enumerate(labels):
            if label in labels[:index]:
                raise FieldError(("judges", index), f"judge names must be unique; '{label}' repeats (set 'name' to "
                                                    "tell them apart)")
        return self


class SpeakerRewardWeights(RewardWeights):
    persona_rm: float = Field(default=1.0, ge=0, description="Weight of the persona reward model's score.")
    format: float = Field(default=0.5, ge=0, description="Weight of the format reward (0 to 1).")
    conciseness: float = Field(default=0.5, ge=0, description="Weight of the conciseness reward (0 to 1).")


class SpeakerConfig(GRPOPolicyConfig):
    """The GRPO Speaker: one LoRA adapter shared by every persona, rewarded by the persona reward model,
    a format reward and a conciseness reward."""

    # Parameters that control the rewards
    reward_weights: SpeakerRewardWeights = Field(default_factory=SpeakerRewardWeights,
                                                 description="Weights of the reward terms.")
    min_words: int = Field(default=8, ge=0, description="Conciseness band: fewest words with full reward.")
    max_words: int = Field(default=80, ge=1, description="Conciseness band: most words with full reward.")

    @model_validator(mode="after")
    def _band(self) -> SpeakerConfig:
        if self.min_words > self.max_words:
            raise FieldError("min_words", f"min_words ({self.min_words}) must not exceed max_words ({self.max_words})")
        return self


class BeforeAfterConfig(Section):
    """The held-out comparison of the base policy and the trained Speaker."""

    samples_per_prompt: int = Field(default=1, ge=1, description="Replies sampled per held-out prompt and policy.")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Level of the bootstrap intervals.")
    bootstrap_resamples: int = Field(default=10000, ge=100, description="Resamples for the paired bootstrap.")
