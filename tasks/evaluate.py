"""Prefect tasks of the evaluation: each a thin wrapper over one library call, cached and retried like the stages'."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from mascot.artifacts import Artifact, merge_parquet
from mascot.config import DataConfig
from mascot.config.training import SFTPolicyConfig
from mascot.evaluation import baselines, conversations, pairwise, report, scoring
from mascot.evaluation.conversations import ConversationJob
from mascot.evaluation.pairwise import PairwiseJob
from mascot.evaluation.report import ReportSpec
from mascot.evaluation.scoring import ScoringJob
from mascot.roster import Roster
from mascot.train.launch import launched
from mascot.train.runtime import checkpoint_dir
from mascot.train.sft import train_sft_policy
from tasks.caching import CACHED, keyed
from tasks.failures import REPORTED
from tasks.stage1 import LLM_RETRIES


@task(**CACHED, **REPORTED)
def train_sft_baseline(config: SFTPolicyConfig, contexts: Artifact, candidates: Artifact, judgments: Artifact,
                       assistant: Roster, out: Path) -> Artifact:
    """The SFT baseline: the base Speaker fine-tuned (LoRA) on the training contexts' best-judged replies."""
    records, out = baselines.sft_records(contexts, candidates, judgments, assistant), keyed(out)
    checkpoints = checkpoint_dir(out, config, assistant, contexts, candidates, judgments)
    return launched(config, train_sft_policy, config, records, out, checkpoints, name="sft",
                    details={"contexts": len(records)})


@task(**CACHED, **REPORTED)
def write_eval_contexts(data: DataConfig, stage1_contexts: Artifact, seed: int, out_of_domain: bool,
                        out: Path) -> Artifact:
    return conversations.write_eval_contexts(data, stage1_contexts, seed, out_of_domain, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def play_conversations(job: ConversationJob, ids: list[str], out: Path) -> Artifact:
    return conversations.play_shard(job, ids, keyed(out))


@task(**CACHED, **REPORTED)
def merge_conversations(shards: list[Artifact], out: Path) -> Artifact:
    return merge_parquet(shards, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def judge_conversations(job: ScoringJob, played: Artifact, out: Path) -> Artifact:
    return scoring.judge_conversations(job, played, keyed(out))


@task(**CACHED, **REPORTED)
def merge_judgments(shards: list[Artifact], out: Path) -> Artifact:
    return merge_parquet(shards, keyed(out))


@task(**CACHED, **REPORTED)
def score_conversations(job: ScoringJob, played: Artifact, judgments: Artifact, out: Path) -> Artifact:
    return scoring.score_conversations(job, played, judgments, keyed(out))


@task(**CACHED, **REPORTED, **LLM_RETRIES)
def judge_preferences(job: PairwiseJob, played: Artifact, out: Path) -> Artifact:
    return pairwise.judge_preferences(job, played, keyed(out))


@task(**CACHED, **REPORTED)
def report_evaluation(spec: ReportSpec, contexts: Artifact, scores: Artifact, played: Artifact,
                      preferences: Artifact, out: Path, judgments: Artifact | None = None) -> dict[str, Artifact]:
    summary, written = report.write_report(spec, contexts, scores, played, preferences, keyed(out), judgments)
    key = f"{spec.run}-eval".lower().replace("_", "-").replace(".", "-")
    rows = [entry for entry in summary["results"]["all"]["summaries"] if entry["metric"] == "overall"]
    if rows:
        create_table_artifact(key=f"{key}-overall", table=rows,
                              description="Overall scores per system and level (0-100, bootstrap over contexts)")
    create_markdown_artifact(key=f"{key}-summary", markdown=written["eval/report"].path.read_text(),
                             description=f"Evaluation report of run {spec.run}")
    return written
