"""The evaluation in a config: the systems under test, how their conversations run, and its own judges."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from mascot.config.backends import BackendConfig, JudgeConfig
from mascot.config.base import ConfigPath, Section
from mascot.yamlio import FieldError

SystemName = Literal["mascot", "mascot_dpo", "multi_agent", "mascot_p", "mascot_c", "mascot_c_generic", "zero_shot",
                     "zero_shot_cot",
                     "few_shot", "few_shot_cot", "sft", "self_consistency"]
SYSTEM_NAMES: tuple[str, ...] = get_args(SystemName)
# MASCOT with the DPO Director is played wherever Stage 2 trained one, so it is not listed by default; MASCOT-C with
# the generic instruction, a second ablation that mixes two, is played only where listed.
DEFAULT_SYSTEMS = tuple(name for name in SYSTEM_NAMES if name not in ("mascot_dpo", "mascot_c_generic"))
# The systems that answer with a group of personas (mascot.evaluation.systems.SYSTEMS says how each answers); the
# collective rubric compares these only.
GROUP_SYSTEMS = frozenset({"mascot", "mascot_dpo", "multi_agent", "mascot_p", "mascot_c", "mascot_c_generic"})
# The systems built from the GRPO-trained Speaker or Director, which are played once per training seed
# (eval.training_seeds); the untrained group and the single assistants are played once.
SEEDED_SYSTEMS = GROUP_SYSTEMS - {"multi_agent"}
# The automatic metrics (mascot.evaluation.metrics.automatic_metrics), which a primary endpoint may name.
AUTOMATIC_METRICS = ("distinct_1", "distinct_2", "distinct_1_per_turn", "distinct_2_per_turn", "self_bleu",
                     "mean_length", "sentiment")
PrimaryLevel = Literal["persona", "collective", "automatic"]


class PrimaryEndpoint(Section):
    """The one comparison the evaluation is declared, before it runs, to test: MASCOT minus `baseline` on `metric` of
    `level`, on the contexts of `eval_set`. It is reported first, with its own p; every other comparison is
    secondary and Holm-adjusted together."""

    baseline: SystemName | None = Field(default=None, description="The system MASCOT is compared with (default: the "
                                        "untrained multi-agent group, multi_agent, where listed; else the first "
                                        "other group system listed; else the first other system listed).")
    level: PrimaryLevel | None = Field(default=None, description="persona, collective or automatic (default: "
                                       "collective against a group, whose rubric scores one voice low by "
                                       "construction, so persona against a single assistant).")
    metric: str = Field(default="overall", min_length=1, description="A criterion of that level's rubric, 'overall', "
                        "or an automatic metric.")
    eval_set: str = Field(default="held_out", min_length=1, description="'held_out' (Stage 1's held-out contexts), "
                          "'all', or a data.held_out corpus as '<source>:<split>'.")


class EvalConfig(Section):
    """MASCOT against named baselines and ablations on the held-out contexts (and out of domain)."""

    systems: list[SystemName] = Field(default_factory=lambda: list(DEFAULT_SYSTEMS), min_length=1,
                                      description="Systems under test; 'mascot' (the GRPO Director) is compared with "
                                      "each of the others, and 'mascot_dpo' is added where Stage 2 trained a DPO "
                                      "Director.")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1,
                             description="Seeds: each system plays every context once per seed.")
    training_seeds: int = Field(default=1, ge=1, description="Training runs of the group: the Speaker's GRPO and the "
                                "GRPO Director are trained this many times from the same data (training seeds "
                                "offset by 0..N-1; the reward models once), the systems built from them are played "
                                "once per run, and every interval resamples the runs as well as the contexts. 1: one "
                                "run, and training variance is in no interval.")
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
    cot_reasoning_tokens: int = Field(default=256, ge=0, description="Tokens a CoT system may reason in before its "
                                      "reply, on top of its reply's share of eval.block_tokens, so reasoning does not "
                                      "eat into the matched reply budget.")
    cot_attempts: int = Field(default=3, ge=1, description="Samples of a CoT turn until one has its 'Reply:' marker "
                              "(each with its own seed); a turn without one after these is counted as a failure.")
    self_consistency_samples: int = Field(default=5, ge=2, description="Replies sampled per Self-Consistency turn.")
    out_of_domain: bool = Field(default=True, description="Also play the contexts of data.held_out (e.g. ESConv).")
    contexts_per_shard: int = Field(default=8, ge=1, description="Contexts per cached conversation shard.")
    max_judge_failure_rate: float = Field(default=0.1, ge=0.0, le=1.0,
                                          description="Fail the run when more judgments than this share fail.")
    primary: PrimaryEndpoint = Field(default_factory=PrimaryEndpoint, description="The pre-declared primary endpoint.")
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

    @model_validator(mode="after")
    def _primary_is_a_comparison_made(self) -> EvalConfig:
        """Resolve the primary endpoint's defaults from the systems listed, and refuse one no comparison makes."""
        primary = self.primary
        others = [name for name in self.systems if name != "mascot"]
        if primary.baseline is not None and primary.baseline not in others:
            raise FieldError(("primary", "baseline"), (
                f"'{primary.baseline}' is not a baseline of this evaluation: MASCOT is compared with the systems of "
                f"eval.systems other than 'mascot' ({', '.join(others) or 'none listed'})"))
        if primary.baseline is None and others:
            groups = [name for name in others if name in GROUP_SYSTEMS]
            primary.baseline = "multi_agent" if "multi_agent" in others else (groups or others)[0]
        if primary.baseline is not None and primary.level is None:
            primary.level = "collective" if primary.baseline in GROUP_SYSTEMS else "persona"
        if primary.level == "collective" and primary.baseline is not None and primary.baseline not in GROUP_SYSTEMS:
            raise FieldError(("primary", "level"), (
                f"'{primary.baseline}' is a single assistant, and the collective rubric scores one voice low by "
                "construction, so the collective level compares group systems only; choose level persona or "
                "automatic, or a group baseline"))
        if primary.level == "automatic" and primary.metric not in AUTOMATIC_METRICS:
            raise FieldError(("primary", "metric"), (
                f"'{primary.metric}' is not an automatic metric; expected one of {', '.join(AUTOMATIC_METRICS)}"))
        return self
