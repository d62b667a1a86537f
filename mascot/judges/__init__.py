"""Judges of Stage 1: rubrics, the LLM judge, the offline heuristic judge (not an LLM), the panel.

    panel = make_panel(config.stage1, load_rubric(config.stage1.rubric), cache=request_cache)
    judgments = await panel.judge_all(judge_items(candidates), seed=config.run.seed)
    frame = judgments_frame(judgments, rubric)
    check_failure_rate(frame, config.stage1.max_judge_failure_rate)
    scores = panel.aggregate(frame)

`mascot.config` imports `mascot.judges.rubrics`, so this package must not import `mascot.config`
at import time: the LLM judge and the panel (which need it) are loaded on first use.
"""

from mascot.judges.base import Judge, JudgeItem, Judgment, judge_items
from mascot.judges.heuristic import HeuristicJudge, HeuristicSettings, extract_features
from mascot.judges.rubrics import Criterion, Rubric, load_rubric

_LAZY = {
    "LLMJudge": "mascot.judges.llm_judge",
    "JudgeReplyError": "mascot.judges.llm_judge",
    "parse_judge_reply": "mascot.judges.llm_judge",
    "judge_messages": "mascot.judges.llm_judge",
    "judge_response_format": "mascot.judges.llm_judge",
    "JudgePanel": "mascot.judges.panel",
    "JudgeFailureRateExceeded": "mascot.judges.panel",
    "make_judge": "mascot.judges.panel",
    "make_panel": "mascot.judges.panel",
    "judgments_frame": "mascot.judges.panel",
    "aggregate_scores": "mascot.judges.panel",
    "agreement": "mascot.judges.panel",
    "failure_rate": "mascot.judges.panel",
    "check_failure_rate": "mascot.judges.panel",
}

__all__ = [
    "Criterion", "HeuristicJudge", "HeuristicSettings", "Judge", "JudgeFailureRateExceeded", "JudgeItem",
    "JudgePanel", "JudgeReplyError", "Judgment", "LLMJudge", "Rubric", "aggregate_scores", "agreement",
    "check_failure_rate", "extract_features", "failure_rate", "judge_items", "judge_messages",
    "judge_response_format", "judgments_frame", "load_rubric", "make_judge", "make_panel", "parse_judge_reply",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mascot.judges' has no attribute {name!r}")
