"""The evaluation in a config: the systems under test, how their conversations run, and its own judges."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from mascot.config.backends import BackendConfig, JudgeConfig
from mascot.config.base import ConfigPath, Section

SystemName = Literal["mascot", "mascot_dpo", "multi_agent", "mascot_p", "mascot_c", "zero_shot", "zero_shot_cot",
                     "few_shot", "few_shot_cot", "sft", "self_consistency"]
SYSTEM_NAMES: tuple[str, ...] = get_args(SystemName)
# MASCOT with the DPO Director is played wherever Stage 2 trained one, so it is not listed by default.
DEFAULT_SYSTEMS = tuple(name for name in SYSTEM_NAMES if name != "mascot_dpo")


class EvalConfig(Section):
    """MASCOT against named baselines and ablations on the held-out contexts (and out of domain)."""

    systems: list[SystemName] = Field(default_factory=lambda: list(DEFAULT_SYSTEMS), min_length=1,
                                      description="Systems under test; 'mascot' (the GRPO Director) is compared with "
                                      "each of the others, and 'mascot_dpo' is added where Stage 2 trained a DPO "
                                      "Director.")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1,
                             description="Seeds: each system plays every context once per seed.")
    blocks: int = Field(default=1, ge=1, description="Blocks per conversation, the simulated user's turn between two.")
    block_turns: int | None = Field(default=None, ge=1, description="Companion turns per block of the group systems "
                                    "(default stage2.episodes.block_turns); a single-assistant system takes one.")
    block_tokens: int | None = Field(default=None, ge=1, description="Companion tokens per block, the same for every "
                                     "system: each of a group's block_turns turns may write block_tokens / "
                                     "block_turns, a single assistant's one reply all of them (default: block_turns "
                                     "x the trained Speaker's max_new_tokens, so the group's turns keep the length "
                                     "they were trained at). Must be a multiple of block_turns.")
    assistant: ConfigPath = Field(description="A one-persona roster YAML: the generic assistant of the "
                                  "single-assistant baselines.")
    rubric: ConfigPath | None = Field(default=None, description="Persona-level rubric (default stage1.rubric).")
    group_rubric: ConfigPath | None = Field(default=None, description="Collective rubric (default stage2.rubric).")
    neutral_rubric: ConfigPath | None = Field(default=None, description="System-neutral rubric (the outcome for the "
                                              "user) by which the pairwise judge weighs MASCOT against a single "
                                              "assistant; without it, the collective rubric, which the report says "
                                              "favours groups.")
    judges: list[JudgeConfig] = Field(min_length=1, description="The evaluation's persona-level panel; its own, "
                                      "whether or not it shares a judge with the panels that labelled training data.")
    group_judges: list[JudgeConfig] = Field(min_length=1, description="The evaluation's collective panel.")
    pairwise: JudgeConfig = Field(description="The judge that compares two systems' conversations, in both orders.")
    director: BackendConfig | None = Field(default=None, description="The trained GRPO Director; by default "
                                           "train.director.model with stage2/director in this process.")
    director_dpo: BackendConfig | None = Field(default=None, description="The trained DPO Director; by default "
                                               "train.director_dpo.model with stage2/director_dpo in this process.")
    speaker: BackendConfig | None = Field(default=None, description="The trained Speaker; by default as in Stage 2.")
    sft: BackendConfig | None = Field(default=None, description="The SFT baseline; by default train.sft.model with "
                                      "eval/sft in this process, sampling as `generation` does.")
    few_shot_examples: int = Field(default=2, ge=1, description="Few-shot examples, drawn from training contexts.")
    self_consistency_samples: int = Field(default=5, ge=2, description="Replies sampled per Self-Consistency turn.")
    out_of_domain: bool = Field(default=True, description="Also play the contexts of data.held_out (e.g. ESConv).")
    contexts_per_shard: int = Field(default=8, ge=1, description="Contexts per cached conversation shard.")
    max_judge_failure_rate: float = Field(default=0.1, ge=0.0, le=1.0,
                                          description="Fail the run when more judgments than this share fail.")
    bootstrap_resamples: int = Field(default=2000, ge=100, description="Resamples of every bootstrap interval.")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, description="Level of every interval.")

    @field_validator("systems", "seeds")
    @classmethod
    def _unique(cls, values: list) -> list:
        if len(set(values)) != len(values):
            raise ValueError(f"each entry may appear once, got {values}")
        return values

    @field_validator("systems")
    @classmethod
    def _mascot_first(cls, systems: list[str]) -> list[str]:
        if "mascot" not in systems:
            raise ValueError("the evaluation compares 'mascot' with the other systems, so 'mascot' must be listed")
        return systems

