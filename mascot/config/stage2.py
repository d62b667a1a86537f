"""Stage 2 in a config: episodes and branching, the group judge and pairs; the Director's trainers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mascot.config.backends import BackendConfig, JudgeConfig
from mascot.config.base import ConfigPath, Section
from mascot.config.stage1 import BeforeAfterConfig
from mascot.config.training import GRPOPolicyConfig, LoraConfig, RewardWeights, TrainerConfig


class EpisodeConfig(Section):
    """How an episode runs: a main line of blocks with branch points (states), and from each state M
    trajectories, each opened by its own directive."""

    block_turns: int = Field(default=3, ge=1, description="Companion turns per block (N).")
    prefix_blocks: int = Field(default=1, ge=0, description="Blocks played before the first branch point.")
    states: int = Field(default=1, ge=1, description="Branch points per episode: after `prefix_blocks` blocks, then "
                        "after every further block of the episode's main line.")
    mode: Literal["trajectory", "block"] = Field(
        default="trajectory", description="`trajectory` (the paper's): a branch runs `trajectory_blocks` blocks, each "
        "followed by the user's turn, and the GRPO Director's policy makes every directive of its rollouts. `block`: "
        "a branch is one block without the user's turn, and the base Director plays the rest of a rollout's block.")
    trajectory_blocks: int = Field(default=1, ge=1, description="Blocks of a trajectory, from its state to the "
                                   "episode's end (mode `trajectory`; `block` mode has 1).")
    user_turns: bool = Field(default=True, description="The simulated user replies after every block.")
    branches: int = Field(default=4, ge=2, description="Trajectories sampled from each state (M), each opened by "
                          "its own directive.")
    max_directive_attempts: int = Field(default=3, ge=1, description="Director requests per turn before the "
                                        "fallback (a seeded random persona) is used.")
    contexts_per_shard: int = Field(default=8, ge=1, description="Episodes per cached generation shard.")

    @model_validator(mode="after")
    def _one_block_in_block_mode(self) -> EpisodeConfig:
        if self.mode == "block" and self.trajectory_blocks != 1:
            raise ValueError(f"mode 'block' plays one block per branch, so trajectory_blocks must be 1, not "
                             f"{self.trajectory_blocks}; use mode 'trajectory' for longer trajectories")
        return self

    @property
    def trajectory_user_turns(self) -> bool:
        """Whether a trajectory's blocks end with the user's turn (only whole trajectories have them)."""
        return self.user_turns and self.mode == "trajectory"


class Stage2Config(Section):
    director: BackendConfig = Field(description="The base Director that plays episodes (before training).")
    speaker: BackendConfig | None = Field(
        default=None, description="The Speaker that replies to directives; by default the Stage 1 Speaker adapter "
        "(train.speaker.model with stage1/speaker) in this process. For a server, the served adapter's name.")
    user: BackendConfig = Field(description="The simulated user.")
    episodes: EpisodeConfig = Field(default_factory=EpisodeConfig)
    margin: float = Field(default=0.5, ge=0.0, description="Minimum overall-score gap for a trajectory pair.")
    rubric: ConfigPath = Field(description="Collective rubric YAML: the criteria of a whole block.")
    judges: list[JudgeConfig] = Field(min_length=1, description="Group judge panel scoring every branch's block.")
    aggregation: Literal["mean", "zscore"] = Field(default="mean", description="How the panel's scores combine.")
    max_judge_failure_rate: float = Field(default=0.1, ge=0.0, le=1.0,
                                          description="Fail the run when more judgments than this share fail.")


class DirectorRewardWeights(RewardWeights):
    group_rm: float = Field(default=1.0, ge=0, description="Weight of the group reward model's score of the block.")
    format: float = Field(default=0.5, ge=0, description="Weight of the format reward: 1 for a valid directive.")


class DirectorConfig(GRPOPolicyConfig):
    """The GRPO Director (the paper's method): a LoRA adapter rewarded by the group reward model's score
    of the block its directive leads to, plus a small format reward for a valid directive."""

    reward_weights: DirectorRewardWeights = Field(default_factory=DirectorRewardWeights,
                                                  description="Weights of the reward terms.")
    rollouts: int = Field(
        default=1, ge=1, description="Rollouts of each sampled directive, each with its own seed; its group reward "
        "model term is their mean. More rollouts mean less noise in GRPO's advantages, at that many times the "
        "rollouts' cost.")
    credit: Literal["directive", "choice"] = Field(
        default="directive", description="The tokens GRPO's loss reads: the whole sampled directive, or its choice "
        "(up to the end of its `next_speaker` value; a directive that names nobody is read whole). A directive's "
        "instruction can take the credit of its choice where it is sampled with much entropy (docs/stage2.md).")


class DirectorDPOConfig(TrainerConfig):
    """TRL's DPOTrainer on a LoRA adapter over the stored directive pairs: an alternative to GRPO, not the
    paper's method."""

    lora: LoraConfig = Field(default_factory=LoraConfig, description="The adapter that is trained.")
    learning_rate: float = Field(default=5e-6, gt=0, description="Peak learning rate.")
    epochs: float = Field(default=1.0, gt=0, description="Passes over the directive pairs (num_train_epochs).")
    beta: float = Field(default=0.1, gt=0, description="DPO's temperature: how far the policy may move from the base.")
    max_length: int = Field(default=2048, ge=16, description="Longest prompt + directive in tokens.")


class DirectorEvalConfig(BeforeAfterConfig):
    """The held-out comparison of the base Director and the trained one."""

    rollouts: int = Field(
        default=2, ge=1, description="Rollouts of every sampled directive, each with its own seed; the directive's "
        "score is their mean. With 2 or more, the report separates the rollouts' noise from the spread between "
        "directives, which is all a Director can change.")
