"""Group judges: the collective rubric applied to a whole trajectory (its blocks of companion turns,
with the simulated user's turns between them).

A `BlockItem` is one branch's trajectory after one state; its features read the companions' turns,
each against the conversation up to it, the user's turns included. Judges return the same `Judgment` as the
persona-level judges (keyed by state id and branch), so panels, failure rates, aggregation and
preference pairs work unchanged. The LLM group judge is `mascot.judges.llm_judge.LLMJudge` with
the block prompt (`group_judge_messages`): the same structured output, retries and recorded
failures as Stage 1's judge.

`GroupHeuristicJudge` is the offline judge of the tiny profile. It is NOT an LLM. Its features:
each turn's persona adherence and relevance (the persona-level heuristic's own features, computed
against the conversation up to that turn), redundancy between the block's turns (word-trigram
overlap and Self-BLEU), the diversity of speakers, and repetition of what companions said before
the block. docs/judges.md lists every formula; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from itertools import combinations
from statistics import fmean

from mascot.data.context import Context, Message
from mascot.data.qmsum import meeting_query
from mascot.dialogue.turns import USER, Turn
from mascot.judges.base import JudgeItem, Judgment
from mascot.judges.heuristic import (
    HeuristicSettings,
    contribution,
    extract_features,
    persona_fit,
    trigrams,
    words,
)
from mascot.judges.llm_judge import escape_data
from mascot.prompts import render
from mascot.roster import Roster
from mascot.rubrics import Rubric


@dataclass(frozen=True)
class BlockItem:
    """One branch's trajectory after a state, as a group judge sees it."""

    query_id: str  # the state id
    candidate_idx: int  # the branch
    context: Context
    roster: Roster
    state: list[Turn]  # every turn before the block, the context's opening included
    block: list[Turn]  # the trajectory: companion turns, and the user's turns between blocks


def speaker_label(turn: Turn, roster: Roster) -> str:
    """Who said a turn, as a reader sees it: a companion's persona name, else the speaker capitalised."""
    return roster.get(turn.speaker).name if turn.role == "companion" else turn.speaker.capitalize()


def turn_lines(turns: list[Turn], roster: Roster) -> list[dict[str, str]]:
    return [{"speaker": escape_data(speaker_label(t, roster)), "text": escape_data(t.text.strip() or "(empty)")}
            for t in turns]


def group_judge_messages(rubric: Rubric, item: BlockItem) -> list[dict[str, str]]:
    """The group judge's request: instructions and collective rubric (system), then the delimited data,
    with the context's query when it has one."""
    query = meeting_query(item.context)
    system = render("judge_group.j2", section="system", rubric=rubric, domain=item.context.domain, query=query)
    user = render("judge_group.j2", section="user", personas=item.roster.active, query=query and escape_data(query),
                  context=turn_lines(item.state, item.roster), block=turn_lines(item.block, item.roster))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


DEFAULT_SETTINGS = HeuristicSettings()


@dataclass
class BlockFeatures:
    """Everything the formulas read, kept for the feedback text and for tests."""

    persona_fit: list[float] = field(default_factory=list)
    relevance: list[float] = field(default_factory=list)
    contribution: list[float] = field(default_factory=list)
    hygiene: list[float] = field(default_factory=list)
    trigram_overlap: float = 0.0  # mean over pairs of turns: shared trigrams / the shorter turn's trigrams
    self_bleu: float = 0.0  # mean over turns: BLEU of the turn against the block's other turns
    speaker_diversity: float = 0.0  # distinct speakers / the most the block could have
    repeats_earlier: float = 0.0  # mean share of a turn's trigrams that companions said before the block

    @property
    def redundancy(self) -> float:
        return (self.trigram_overlap + self.self_bleu) / 2


def _as_message(turn: Turn) -> Message:
    return Message(role="user" if turn.speaker == USER else "assistant", content=turn.text.strip() or "(empty)")


@cache
def _bleu():
    try:
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    except ImportError as exc:
        raise ImportError("the group heuristic judge needs nltk: pip install 'mascot[metrics]'") from exc
    return sentence_bleu, SmoothingFunction().method1


def self_bleu(texts: list[list[str]]) -> float:
    """Mean BLEU-4 (smoothed) of each tokenised text against all the others as references."""
    sentence_bleu, smoothing = _bleu()
    scores = [sentence_bleu([other for j, other in enumerate(texts) if j != i], tokens, smoothing_function=smoothing)
              for i, tokens in enumerate(texts) if tokens and any(texts[j] for j in range(len(texts)) if j != i)]
    return fmean(scores) if scores else 0.0


def block_features(item: BlockItem, settings: HeuristicSettings = DEFAULT_SETTINGS) -> BlockFeatures:
    f = BlockFeatures()
    episode_turns = [t for t in item.state if t.role != "context"]
    companions = [t for t in item.block if t.role == "companion"]
    for k, turn in enumerate(item.block):
        if turn.role != "companion":
            continue
        # The turn is judged against the conversation up to it: the context, the episode, the trajectory so far.
        history = [*item.context.history, *map(_as_message, [*episode_turns, *item.block[:k]])]
        reply = JudgeItem(item.query_id, item.candidate_idx, item.context.model_copy(update={"history": history}),
                          item.roster.get(turn.speaker), turn.text)
        features = extract_features(reply, settings)
        f.persona_fit.append(persona_fit(features, settings))
        f.relevance.append(features.relevance * features.hygiene)
        f.contribution.append(contribution(features, settings))
        f.hygiene.append(features.hygiene)
    tokens = [words(t.text) for t in companions]
    grams = [set(trigrams(t)) for t in tokens]
    overlaps = [len(a & b) / min(len(a), len(b)) if a and b else 0.0 for a, b in combinations(grams, 2)]
    f.trigram_overlap = fmean(overlaps) if overlaps else 0.0
    f.self_bleu = self_bleu(tokens) if len(tokens) > 1 else 0.0
    most = min(len(companions), len(item.roster.active))
    f.speaker_diversity = len({t.speaker for t in companions}) / most if most else 0.0
    earlier = {g for t in item.state if t.role == "companion" for g in trigrams(words(t.text))}
    f.repeats_earlier = fmean(len(g & earlier) / len(g) if g else 0.0 for g in grams) if grams else 0.0
    return f


def _mean(values: list[float]) -> float:
    return fmean(values) if values else 0.0


# criterion id -> quality in [0, 1]. Every formula is scaled by the turns' mean hygiene (length,
# repetition within a turn, assistant boilerplate), as in the persona-level heuristic.
GROUP_FORMULAS = {
    "persona_fidelity": lambda f: _mean(f.persona_fit),
    "originality": lambda f: _mean(f.hygiene) * (1.0 - f.redundancy),
    "relevance": lambda f: _mean(f.relevance),
    "engagement": lambda f: _mean(f.hygiene) * (0.5 * f.speaker_diversity + 0.5 * _mean(f.contribution)),
    "consistency": lambda f: _mean(f.hygiene) * (1.0 - f.repeats_earlier),
    # The system-neutral rubric's criteria (configs/rubrics/outcome_*.yaml): per-turn means only, so that one
    # voice, or fewer turns, scores no lower than several.
    "felt_heard": lambda f: _mean(f.relevance),
    "moved_forward": lambda f: _mean(f.hygiene) * _mean(f.contribution),
    "safety": lambda f: _mean(f.hygiene),
    "on_topic": lambda f: _mean(f.relevance),
}


class GroupHeuristicJudge:
    """Deterministic feature-based group judge (NOT an LLM) for the collective rubric's ids.

    It never fails; an empty block scores the lowest on every criterion. `seed` is ignored.
    """

    kind = "heuristic"

    def __init__(self, rubric: Rubric, name: str = "heuristic", settings: HeuristicSettings | None = None):
        if (problem := self.rubric_problem(rubric)) is not None:
            raise ValueError(problem)
        self.rubric, self.name = rubric, name
        self.settings = settings or HeuristicSettings()

    @staticmethod
    def rubric_problem(rubric: Rubric) -> str | None:
        """Why this judge cannot score the rubric (criteria it has no formula for, such as a persona-level
        rubric's), or None. `mascot config validate` asks this, so a config is refused before Stage 1 runs."""
        unsupported = [c for c in rubric.criterion_ids if c not in GROUP_FORMULAS]
        if not unsupported:
            return None
        return (f"the group heuristic judge has no formula for criteria {unsupported} of rubric "
                f"'{rubric.name}'; it can score: {', '.join(GROUP_FORMULAS)}")

    def score(self, item: BlockItem) -> tuple[dict[str, float], BlockFeatures]:
        features = block_features(item, self.settings)
        low, high = self.rubric.scale_min, self.rubric.scale_max
        return {cid: round(low + (high - low) * min(1.0, max(0.0, GROUP_FORMULAS[cid](features))), 2)
                for cid in self.rubric.criterion_ids}, features

    async def judge(self, item: BlockItem, seed: int) -> Judgment:
        scores, f = self.score(item)
        feedback = (f"Group heuristic judge (not an LLM): {len(item.block)} turns by "
                    f"{len({t.speaker for t in item.block})} speakers; trigram overlap {f.trigram_overlap:.2f}, "
                    f"Self-BLEU {f.self_bleu:.2f}, repeats of earlier turns {f.repeats_earlier:.2f}, "
                    f"mean persona fit {_mean(f.persona_fit):.2f}, mean relevance {_mean(f.relevance):.2f}.")
        return Judgment.succeeded(item, self.name, scores, feedback)
