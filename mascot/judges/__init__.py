"""Judges: the LLM judge, the offline heuristic judge (not an LLM), and the panel that combines them.

    panel = make_panel(PanelSpec(judges=config.stage1.judges, rubric=load_rubric(config.stage1.rubric)),
                       cache=request_cache)
    judgments = await panel.judge_all(judge_items(candidates), seed=config.run.seed)
    frame = judgments_frame(judgments, rubric)
    check_failure_rate(frame, config.stage1.max_judge_failure_rate)
    scores = panel.aggregate(frame)

Rubrics, the criteria judges score against, are configuration and live in `mascot.rubrics`.
"""

from mascot.judges.base import Judge, JudgeItem, Judgment, judge_items
from mascot.judges.heuristic import HeuristicJudge, HeuristicSettings, extract_features
from mascot.judges.llm_judge import (
    JudgeReplyError,
    LLMJudge,
    judge_messages,
    judge_response_format,
    parse_judge_reply,
)
from mascot.judges.panel import (
    JudgeFailureRateExceeded,
    JudgePanel,
    PanelSpec,
    aggregate_scores,
    agreement,
    check_failure_rate,
    failure_rate,
    judgments_frame,
    make_judge,
    make_panel,
)

__all__ = [
    "HeuristicJudge", "HeuristicSettings", "Judge", "JudgeFailureRateExceeded", "JudgeItem", "JudgePanel",
    "JudgeReplyError", "Judgment", "LLMJudge", "PanelSpec", "aggregate_scores", "agreement", "check_failure_rate",
    "extract_features", "failure_rate", "judge_items", "judge_messages", "judge_response_format", "judgments_frame",
    "make_judge", "make_panel", "parse_judge_reply",
]
