"""What the baselines learn from: Stage 1's best-judged candidates of training contexts.

Few-Shot's examples and SFT's training set both come from here, and only from contexts that
contexts.parquet does not hold out: no held-out context can leak into a baseline.
"""

from __future__ import annotations

import hashlib

import polars as pl

from mascot.artifacts import Artifact
from mascot.data.contexts import read_contexts
from mascot.evaluation.systems import FewShotExample, assistant_messages
from mascot.roster import Roster


def best_candidates(contexts: Artifact, candidates: Artifact, judgments: Artifact) -> pl.DataFrame:
    """For each training context, its best-judged candidate over all personas (the panel's mean overall
    score; ties to the first query and candidate): context_id, query_id, persona, text, overall."""
    training = contexts.read_parquet().filter(~pl.col("held_out"))["context_id"]
    scored = (judgments.read_parquet().filter(pl.col("ok"))
              .group_by("query_id", "candidate_idx").agg(pl.col("overall").mean()))
    ranked = (candidates.read_parquet().filter(pl.col("context_id").is_in(training.implode()))
              .join(scored, on=["query_id", "candidate_idx"])
              .sort(["context_id", "overall", "query_id", "candidate_idx"], descending=[False, True, False, False]))
    return ranked.group_by("context_id", maintain_order=True).first().select(
        "context_id", "query_id", "persona", "text", "overall")


def few_shot_examples(contexts: Artifact, candidates: Artifact, judgments: Artifact, count: int,
                      seed: int) -> list[FewShotExample]:
    """`count` training contexts, chosen by seed, each as its last message and its best-judged reply."""
    best = best_candidates(contexts, candidates, judgments)
    if best.height < count:
        raise ValueError(f"eval.few_shot_examples is {count}, but only {best.height} training contexts have a "
                         "judged Stage 1 candidate")
    by_id = read_contexts(contexts)
    chosen = sorted(best.iter_rows(named=True),
                    key=lambda row: hashlib.sha256(f"{seed}\x1f{row['context_id']}".encode()).hexdigest())[:count]
    return [FewShotExample(context_id=row["context_id"], message=by_id[row["context_id"]].history[-1].content,
                           reply=row["text"]) for row in chosen]


def sft_records(contexts: Artifact, candidates: Artifact, judgments: Artifact, assistant: Roster) -> list[dict]:
    """SFT's examples: each training context in the single assistant's prompt (as the baseline is played),
    its best-judged candidate the completion."""
    persona, by_id = assistant.active[0], read_contexts(contexts)
    return [{"prompt": assistant_messages(persona, by_id[row["context_id"]]),
             "completion": [{"role": "assistant", "content": row["text"]}]}
            for row in best_candidates(contexts, candidates, judgments).iter_rows(named=True)]

