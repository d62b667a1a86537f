"""Stage 1, persona alignment: contexts -> K candidates -> judge panel -> preference pairs.

    mascot run stage1 --config configs/tiny.yaml --until pairs

Sampling and judging run in shards, pipelined: a shard is judged as soon as it is sampled, while
the next one samples. Each shard is a cached task whose result lives in the run directory, so a
rerun skips every shard already done, and a run killed mid-shard resumes from the request cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.task_runners import ThreadPoolTaskRunner

from mascot.artifacts import Artifact, RunDir
from mascot.config import TINY_MODELS, RunConfig, RunSection, load_config
from mascot.stage1 import PairSettings, plan_shards
from mascot.train.tiny import resolve_model
from tasks import stage1 as steps
from tasks.tracking import publish_stage1_summary

REQUEST_CACHE = "requests.sqlite"


def resolved_models(config: RunConfig) -> dict[str, str]:
    """Build the tiny models once, up front, and map their references to folders."""
    refs = {config.generation.model, *(j.backend.model for j in config.stage1.judges if j.backend)}
    return {ref: resolve_model(ref, config) for ref in refs if ref in TINY_MODELS}


@flow(name="stage1", task_runner=ThreadPoolTaskRunner(max_workers=2))
def stage1(config_path: str, run_name: str | None = None, until: Literal["pairs"] = "pairs",
           refresh: bool = False) -> dict[str, Artifact]:
    """Run Stage 1 of a config up to `until`; returns the artifacts written."""
    config = load_config(config_path)
    if run_name:
        config.run = RunSection.model_validate({**config.run.model_dump(), "name": run_name})
    run = RunDir(config.run_dir)
    run.start(config, Path(config_path))
    model_paths = resolved_models(config)
    cache_path = config.cache.root / REQUEST_CACHE
    seed = config.run.seed
    options = {"refresh_cache": True} if refresh else {}
    sample, judge = steps.sample_candidates.with_options(**options), steps.judge_candidates.with_options(**options)

    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: run.prefect_results}):
        roster = steps.load_roster(config.data.roster)
        rubric = steps.load_rubric_file(config.stage1.rubric)
        contexts = steps.load_contexts(config.data.corpus, seed, run.stage1("contexts.parquet"))
        shards = plan_shards(contexts, roster, config.stage1.shard_size)
        sampled = [
            sample.submit(config.generation, model_paths.get(config.generation.model, config.generation.model),
                          config.stage1.k, seed, contexts, roster, query_ids, cache_path,
                          run.shard("stage1", "candidates", index))
            for index, query_ids in enumerate(shards)
        ]
        judged = [
            judge.submit(config.stage1.judges, model_paths, rubric, seed, contexts, roster, shard, cache_path,
                         run.shard("stage1", "judgments", index))
            for index, shard in enumerate(sampled)
        ]
        candidates = steps.merge_shards(sampled, run.stage1("candidates.parquet"))
        judgments = steps.merge_shards(judged, run.stage1("judgments.parquet"))
        pairs = steps.build_pairs(PairSettings.of(config.stage1), contexts, roster, candidates, judgments,
                                  run.stage1("pairs.parquet"))
    artifacts = {"stage1/contexts": contexts, "stage1/candidates": candidates, "stage1/judgments": judgments,
                 "stage1/pairs": pairs}
    run.record(artifacts)
    publish_stage1_summary(config, rubric, artifacts, cache_path)
    return artifacts
