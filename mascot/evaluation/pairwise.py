"""Head-to-head preference: a pairwise judge compares MASCOT's conversation with a baseline's, in both orders.

For every baseline, context and seed that both systems played, the judge sees the two continuations
of the same context twice: MASCOT's as A and the baseline's as B, then swapped. Each order's
verdict is read from MASCOT's side (win, tie, loss). The pair's outcome is a win (1) or a loss (0)
when both orders agree, and a tie (0.5) otherwise (a tie in either order, or verdicts that flip with
the position); the position-consistency rate is the share of pairs whose verdict survived the swap.

The LLM pairwise judge (`judge_pairwise.j2`) answers `{"reason", "winner"}` as structured output,
retried with a repair turn, then recorded as failed; a pair with a failed order is left out and
counted. The offline `HeuristicPairwiseJudge` (not an LLM) prefers the conversation the group
heuristic judge scores higher overall, by at least `TIE_MARGIN`: it cannot favour a position, so its
consistency is 1 by construction, and the report says so.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict

from mascot.artifacts import Artifact, write_parquet
from mascot.config import JudgeConfig, SamplingParams
from mascot.config.evaluation import SEEDED_SYSTEMS
from mascot.data.contexts import read_contexts
from mascot.data.qmsum import meeting_query
from mascot.dialogue.turns import Turn, opening_turns
from mascot.evaluation.conversations import read_conversations, with_training_seed
from mascot.evaluation.statistics import no_interval_below_min_clusters, win_rate
from mascot.evaluation.systems import SYSTEMS
from mascot.judges.group import BlockItem, GroupHeuristicJudge, turn_lines
from mascot.judges.llm_judge import escape_data
from mascot.llm import LLMBackend, make_backend, request_batch, run_requests, shared_cache
from mascot.llm.structured import ReplyError, extract_json_object
from mascot.progress import cache_hits, shard_progress
from mascot.prompts import render
from mascot.queries import request_seed
from mascot.roster import Roster
from mascot.rubrics import Rubric
from mascot.stats import clustered_mean

TIE_MARGIN = 0.1  # the heuristic pairwise judge's smallest overall-score gap (1-5 scale) that is not a tie
VERDICTS = ("A", "B", "tie")
PREFERENCE_SCHEMA = {"baseline": pl.String, "context_id": pl.String, "seed": pl.Int64, "order": pl.String,
                     "judge": pl.String, "winner": pl.String, "mascot": pl.Float64, "reason": pl.String,
                     "ok": pl.Boolean, "error": pl.String, "attempts": pl.Int64, "rubric": pl.String,
                     "training_seed": pl.Int64}  # MASCOT's (eval.training_seeds), whose conversation was compared


@dataclass(frozen=True)
class Side:
    """One system's continuation of a context, with the roster its speakers come from."""

    roster: Roster
    turns: list[Turn]


@dataclass(frozen=True)
class Verdict:
    winner: str | None  # "A", "B", "tie"; None when the judgment failed
    reason: str
    error: str | None = None
    attempts: int = 1


def pairwise_messages(rubric: Rubric, opening: list[Turn], a: Side, b: Side, domain: str,
                      query: str | None) -> list[dict[str, str]]:
    system = render("judge_pairwise.j2", section="system", rubric=rubric, domain=domain, query=query)
    user = render("judge_pairwise.j2", section="user", query=query and escape_data(query),
                  context=turn_lines(opening, a.roster), a=turn_lines(a.turns, a.roster),
                  b=turn_lines(b.turns, b.roster))
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "preference", "strict": True, "schema": {
    "type": "object", "properties": {"reason": {"type": "string"}, "winner": {"type": "string", "enum": list(VERDICTS)}},
    "required": ["reason", "winner"], "additionalProperties": False}}}


class LLMPairwiseJudge:
    def __init__(self, backend: LLMBackend, rubric: Rubric, name: str, max_attempts: int = 3,
                 params: SamplingParams | None = None):
        self.backend, self.rubric, self.name, self.max_attempts = backend, rubric, name, max_attempts
        self.params = params or SamplingParams(temperature=0.0, max_new_tokens=512)

    async def compare(self, context, a: Side, b: Side, seed: int) -> Verdict:
        messages = pairwise_messages(self.rubric, opening_turns(context), a, b, context.domain, meeting_query(context))
        error = "no attempt was made"
        for attempt in range(self.max_attempts):
            reply = (await self.backend.generate(messages, n=1, params=self.params, seed=seed + attempt,
                                                 response_format=RESPONSE_FORMAT))[0]
            try:
                found = extract_json_object(reply, {"winner", "reason"})
                if found.get("winner") not in VERDICTS:
                    raise ReplyError(f'"winner" must be one of {list(VERDICTS)}, got {found.get("winner")!r}')
                return Verdict(found["winner"], str(found.get("reason", "")), attempts=attempt + 1)
            except ReplyError as exc:
                error = str(exc)
                messages = [*messages, {"role": "assistant", "content": reply.strip() or "(empty reply)"},
                            {"role": "user", "content": f"Your reply could not be used: {error}. Answer again with "
                                                        'the JSON object only: {"reason": ..., "winner": "A", "B" '
                                                        'or "tie"}.'}]
        return Verdict(None, "", error, self.max_attempts)


class HeuristicPairwiseJudge:
    """Not an LLM: the continuation the group heuristic judge scores higher overall, or a tie."""

    def __init__(self, rubric: Rubric, name: str = "heuristic"):
        self.group, self.name = GroupHeuristicJudge(rubric, name), name

    async def compare(self, context, a: Side, b: Side, seed: int) -> Verdict:
        opening = opening_turns(context)
        overall = [sum(scores.values()) / len(scores) for scores, _ in
                   (self.group.score(BlockItem("", 0, context, side.roster, opening, side.turns)) for side in (a, b))]
        gap = overall[0] - overall[1]
        winner = "tie" if abs(gap) < TIE_MARGIN else "A" if gap > 0 else "B"
        return Verdict(winner, f"group heuristic overall {overall[0]:.2f} (A) against {overall[1]:.2f} (B)")


def make_pairwise_judge(config: JudgeConfig, rubric: Rubric, cache=None):
    if config.kind == "heuristic":
        return HeuristicPairwiseJudge(rubric, config.label)
    if config.kind == "planted":
        raise ValueError("a planted judge scores Stage 2's blocks only; it cannot compare two systems (eval.pairwise)")
    return LLMPairwiseJudge(make_backend(config.backend, cache=cache), rubric, config.label, config.max_attempts,
                            config.backend.params)


class PairwiseJob(BaseModel):
    """The pairwise judge, the rubrics it weighs by (the collective one between two groups, the system-neutral one
    between a group and a single assistant), the rosters, and the request cache."""

    model_config = ConfigDict(frozen=True)

    judge: JudgeConfig
    rubric: Rubric
    neutral_rubric: Rubric | None = None

    def rubric_for(self, baseline: str) -> Rubric:
        """The collective rubric scores a single voice low by construction ("one voice dominates", "roles blur"),
        so a group is weighed against a single assistant by the outcome for the user, where one is configured."""
        if SYSTEMS[baseline].group or self.neutral_rubric is None:
            return self.rubric
        return self.neutral_rubric
    roster: Roster
    assistant: Roster
    contexts: Artifact
    seed: int
    requests: Path


def judge_preferences(job: PairwiseJob, conversations: Artifact, out: Path) -> Artifact:
    """Both orders of every (baseline, context, seed) against MASCOT: one row per order. Each of MASCOT's training
    seeds is compared: with a baseline's conversation of the same training seed where the baseline is an ablation
    of the same trained parts, else with the baseline's one conversation."""
    cache = shared_cache(job.requests)
    judges = {rubric.name: make_pairwise_judge(job.judge, rubric, cache)
              for rubric in {job.rubric.name: job.rubric, **({job.neutral_rubric.name: job.neutral_rubric}
                                                              if job.neutral_rubric else {})}.values()}
    contexts = read_contexts(job.contexts)
    sides = {key: Side(job.roster if SYSTEMS[key[0]].group else job.assistant, turns)
             for key, turns in read_conversations(conversations).items()}
    runs: dict[tuple[str, int], list[int]] = {}  # MASCOT's training seeds of each (context, seed)
    for system, context_id, seed, run in sides:
        if system == "mascot":
            runs.setdefault((context_id, seed), []).append(run)
    pairs = [(baseline, context_id, seed, run, theirs) for (baseline, context_id, seed, theirs) in sides
             if baseline != "mascot"
             for run in runs.get((context_id, seed), []) if baseline not in SEEDED_SYSTEMS or run == theirs]

    async def both_orders(row, baseline: str, context_id: str, seed: int, run: int, theirs: int) -> list[dict]:
        mascot, other = sides[("mascot", context_id, seed, run)], sides[(baseline, context_id, seed, theirs)]
        rubric = job.rubric_for(baseline)
        judge = judges[rubric.name]
        results = []
        for order, (a, b) in (("mascot_first", (mascot, other)), ("mascot_second", (other, mascot))):
            row.started()
            verdict = await judge.compare(contexts[context_id], a, b,
                                          request_seed(job.seed, "pairwise", baseline, context_id, str(seed), order))
            row.finished()
            mine = "A" if order == "mascot_first" else "B"
            score = None if verdict.winner is None else 0.5 if verdict.winner == "tie" else float(verdict.winner == mine)
            results.append({"baseline": baseline, "context_id": context_id, "seed": seed, "training_seed": run,
                            "order": order,
                            "judge": judge.name, "winner": verdict.winner, "mascot": score, "reason": verdict.reason,
                            "ok": verdict.winner is not None, "error": verdict.error, "attempts": verdict.attempts,
                            "rubric": rubric.name})
        return results

    async def run(row):
        return await asyncio.gather(*(both_orders(row, *pair) for pair in pairs))

    with shard_progress("pairwise preferences", 2 * len(pairs), cache_hits(cache)) as row, request_batch():
        rows = [r for pair in run_requests(run(row)) for r in pair]
    return write_parquet(pl.DataFrame(rows, schema=PREFERENCE_SCHEMA), out)


def length_controlled_win_rate(outcomes: list[float], mascot_words: list[int], baseline_words: list[int],
                               clusters: list[str], confidence: float = 0.95, resamples: int = 2000,
                               seed: int = 0) -> dict:
    """The win rate at equal length: outcome = a + b * log(MASCOT's words / the baseline's words), fitted by least
    squares over the judged pairs, gives a, the expected outcome where both wrote as much (LLM judges favour longer
    answers, and a group writes several turns per block). Its interval refits on resampled clusters."""
    import numpy as np

    y = np.asarray(outcomes, dtype=float)
    x = np.log((np.asarray(mascot_words, dtype=float) + 1) / (np.asarray(baseline_words, dtype=float) + 1))
    result = {"win_rate": None, "slope": None, "ci_low": None, "ci_high": None, "confidence": confidence,
              "mean_log_length_ratio": float(x.mean()) if x.size else None,
              "method": "intercept of a least-squares fit of the outcome on log(MASCOT's words / the baseline's), "
                        "percentile bootstrap over clusters"}
    if y.size < 2:
        return result

    def fit(index) -> tuple[float, float]:
        xs, ys = x[index], y[index]
        if np.ptp(xs) == 0:
            return float("nan"), float("nan")  # no spread of lengths: the intercept is not identified
        slope, intercept = np.polyfit(xs, ys, 1)
        return float(intercept), float(slope)

    intercept, slope = fit(np.arange(y.size))
    if np.isnan(intercept):
        return result
    labels, inverse = np.unique(np.asarray(clusters, dtype=str), return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(labels.size)]
    rng = np.random.default_rng(seed)
    draws = [fit(np.concatenate([members[k] for k in rng.integers(0, labels.size, labels.size)]))[0]
             for _ in range(resamples)]
    draws = [d for d in draws if not np.isnan(d)]
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail]) if draws else (None, None)
    return result | {"win_rate": float(np.clip(intercept, 0, 1)), "slope": slope,
                     "ci_low": None if low is None else float(np.clip(low, 0, 1)),
                     "ci_high": None if high is None else float(np.clip(high, 0, 1))}


def preference_results(preferences: pl.DataFrame, confidence: float = 0.95, resamples: int = 2000,
                       seed: int = 0, clusters: dict[str, str] | None = None,
                       collective_rubric: str | None = None,
                       lengths: dict[tuple[str, str, int, int], int] | None = None) -> list[dict]:
    """Per baseline: wins, ties and losses of MASCOT, its win rate with an interval over contexts, the
    position-consistency rate, the share of the judge's decisive verdicts (A or B) on the judged pairs that
    picked A (its position bias, 0.5 without one; both orders count), and the pairs left out because an
    order's judgment failed. Intervals resample `clusters` (context id -> its meeting, say; by default each
    context is its own), and where MASCOT was played for several training seeds, the training seeds too, crossed
    with the clusters. `lengths`: companion words by (system, context id, seed, training seed)."""
    cluster = (clusters or {}).get
    results = []
    index = ["context_id", "seed", "training_seed"]
    for (baseline,), rows in with_training_seed(preferences).group_by("baseline", maintain_order=True):
        wide = rows.pivot(on="order", index=index, values="mascot")
        judged = wide.drop_nulls(["mascot_first", "mascot_second"])
        first, second = judged["mascot_first"].to_list(), judged["mascot_second"].to_list()
        outcomes = [a if a == b and a != 0.5 else 0.5 for a, b in zip(first, second, strict=True)]
        consistent = sum(a == b for a, b in zip(first, second, strict=True))
        decisive = rows.join(judged.select(index), on=index).filter(
            pl.col("winner").is_in(["A", "B"]))
        side_a = clustered_mean((decisive["winner"] == "A").cast(pl.Float64).to_list(),
                                [cluster(c, c) for c in decisive["context_id"]], confidence, resamples, seed)
        side_a = no_interval_below_min_clusters(side_a, side_a["clusters"])
        rubrics = rows["rubric"].drop_nulls().unique().to_list() if "rubric" in rows.columns else []
        seeded = baseline in SEEDED_SYSTEMS  # its conversation of MASCOT's training seed, else its only one
        keys = [(c, s, k, k if seeded else 0) for c, s, k in judged.select(index).iter_rows()]
        controlled = None
        if lengths is not None and all(("mascot", c, s, k) in lengths and (baseline, c, s, b) in lengths
                                       for c, s, k, b in keys):
            controlled = length_controlled_win_rate(
                outcomes, [lengths["mascot", c, s, k] for c, s, k, _ in keys],
                [lengths[baseline, c, s, b] for c, s, _, b in keys],
                [cluster(c, c) for c, *_ in keys], confidence, resamples, seed)
        runs = judged["training_seed"].to_list()
        crossed = {"raters": [str(k) for k in runs]} if len(set(runs)) > 1 else {}
        results.append({"baseline": baseline, "failed_pairs": wide.height - judged.height,
                        "rubric": rubrics[0] if len(rubrics) == 1 else None, "collective_rubric": collective_rubric,
                        "length_controlled": controlled,
                        "seeds": judged["seed"].n_unique(), "training_seeds": len(set(runs)),
                        "position_consistency": consistent / judged.height if judged.height else None,
                        "side_a_share": {"share": side_a["value"], "n": side_a["n"], "ci_low": side_a["ci_low"],
                                         "ci_high": side_a["ci_high"], "confidence": confidence,
                                         "interval": "percentile bootstrap over contexts"},
                        **win_rate(outcomes, [cluster(c, c) for c in judged["context_id"]], confidence, resamples,
                                   seed, **crossed),
                        **({"interval": "percentile bootstrap over contexts and training seeds, crossed"}
                           if crossed else {}),
                        "contexts": judged["context_id"].n_unique()})
    return results
