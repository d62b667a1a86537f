"""Trajectories as the group reward model reads them, the group judging step, and the pairs of Stage 2.

The group reward model scores a trajectory after a state as a chat: the prompt is one user
message with the roster, the meeting's query where the context has one, and the conversation up to
the state (`trajectory_prompt`), and the reply
is the trajectory up to the companions' last turn, one labelled line per turn, the user's turns between
them included and a user's turn after them left out, since the model's score is read at the last token
and the judge scores the companions' turns (`trajectory_text`).
The pairs, the GRPO Director's reward and the comparison on held-out states all render
trajectories with these two functions, so the model always reads the form it learned from.

Trajectory pairs follow Stage 1's rule (`mascot.stage1.pairs.build_preference_pairs`): for each
state, every two trajectories whose group scores differ by at least `stage2.margin`. Their
`persona` column is the persona the chosen trajectory's first directive named. Directive pairs,
for DPO, are the same pairs' first directives (parsed, as JSON in the schema's key order), to the
Director's prompt at that state; a trajectory whose first directive was the fallback has no
directive the Director wrote, so its pairs give no directive pair.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from mascot.artifacts import Artifact, write_parquet
from mascot.config import Stage2Config
from mascot.dialogue.directives import director_messages
from mascot.dialogue.episodes import directive_json
from mascot.dialogue.turns import Turn, opening_query
from mascot.judges.group import BlockItem
from mascot.judges.panel import PanelSpec, aggregate_scores, check_failure_rate, judgments_frame, make_panel
from mascot.llm import request_batch, run_requests, shared_cache
from mascot.progress import cache_hits, shard_progress
from mascot.prompts import render
from mascot.roster import Roster
from mascot.stage1.pairs import build_preference_pairs
from mascot.stage2.branching import Setting, read_states

MESSAGES = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))


def _label(turn: Turn, roster: Roster) -> str:
    return roster.get(turn.speaker).name if turn.role == "companion" else turn.speaker.capitalize()


def trajectory_prompt(roster: Roster, state: list[Turn]) -> list[dict[str, str]]:
    turns = [{"speaker": _label(t, roster), "text": t.text} for t in state]
    return [{"role": "user", "content": render("trajectory.j2", personas=roster.active, turns=turns,
                                               query=opening_query(state))}]


def trajectory_text(roster: Roster, trajectory: list[Turn]) -> str:
    """One labelled line per turn, up to the companions' last turn. A reward model reads its score at the last
    token, and the group judge scores the companions' turns, never the simulated user's reply after them: with
    that reply last, the score would be read where the user spoke."""
    companions = [index for index, turn in enumerate(trajectory) if turn.role == "companion"]
    end = companions[-1] + 1 if companions else len(trajectory)
    return "\n".join(f"{_label(t, roster)}: {t.text}" for t in trajectory[:end])


def judge_trajectories(panel: PanelSpec, setting: Setting, episodes: Artifact, out: Path) -> Artifact:
    """Every group judge scores every trajectory; failures are recorded, never scored."""
    cache = shared_cache(setting.requests)
    judges = make_panel(panel, cache=cache)
    items = [BlockItem(state.id, branch, state.context, setting.roster, state.state, trajectory)
             for state in read_states(episodes, setting.contexts) for branch, trajectory in state.branches.items()]
    with shard_progress(f"judging {out.stem}", len(items) * len(judges.judges), cache_hits(cache)) as row, \
            request_batch():
        judgments = run_requests(judges.judge_all(items, setting.seed, on_start=row.started, on_done=lambda _: row.finished()))
    return write_parquet(judgments_frame(judgments, panel.rubric), out)


def build_group_pairs(stage2: Stage2Config, roster: Roster, episodes: Artifact, contexts: Artifact,
                      judgments: Artifact, out: Path) -> Artifact:
    """Trajectory pairs with their prompt, and the Director's prompt and first directives (for DPO)."""
    judged = judgments.read_parquet()
    check_failure_rate(judged, stage2.max_judge_failure_rate)
    states = {state.id: state for state in read_states(episodes, contexts)}
    trajectories = pl.DataFrame(
        [{"query_id": state.id, "candidate_idx": branch, "persona": turns[0].speaker,
          "text": trajectory_text(roster, turns), "directive": directive_json(turns[0].directive),
          "fallback": turns[0].fallback}
         for state in states.values() for branch, turns in state.branches.items()],
        schema={"query_id": pl.String, "candidate_idx": pl.Int64, "persona": pl.String, "text": pl.String,
                "directive": pl.String, "fallback": pl.Boolean})
    pairs = build_preference_pairs(trajectories, aggregate_scores(judged, stage2.aggregation), margin=stage2.margin)
    prompts = pl.DataFrame(
        {"query_id": list(states),
         "prompt": [trajectory_prompt(roster, s.state) for s in states.values()],
         "director_prompt": [director_messages(roster, s.state) for s in states.values()]},
        schema={"query_id": pl.String, "prompt": MESSAGES, "director_prompt": MESSAGES})
    first = trajectories.select("query_id", "candidate_idx", "directive", "fallback")
    pairs = (
        pairs.join(prompts, on="query_id", how="left", maintain_order="left")
        .join(first.rename({"candidate_idx": "chosen_idx", "directive": "chosen_directive",
                            "fallback": "chosen_fallback"}), on=["query_id", "chosen_idx"], maintain_order="left")
        .join(first.rename({"candidate_idx": "rejected_idx", "directive": "rejected_directive",
                            "fallback": "rejected_fallback"}), on=["query_id", "rejected_idx"], maintain_order="left")
    )
    return write_parquet(pairs, out)


def directive_pairs(pairs: pl.DataFrame) -> pl.DataFrame:
    """The trajectory pairs' first directives, where the Director wrote both and they differ, as
    preference pairs for DPO: the Director's prompt at the state, then the chosen or rejected directive."""
    return (
        pairs.filter(~pl.col("chosen_fallback"), ~pl.col("rejected_fallback"),
                     pl.col("chosen_directive") != pl.col("rejected_directive"))
        .select("query_id", "persona", pl.col("director_prompt").alias("prompt"),
                pl.col("chosen_directive").alias("chosen"), pl.col("rejected_directive").alias("rejected"),
                "chosen_score", "rejected_score", "margin")
    )
