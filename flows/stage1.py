"""Stage 1, persona alignment: contexts -> K candidates -> judge panel -> preference pairs
-> persona reward model -> GRPO Speaker -> before/after comparison on held-out prompts.

    mascot run stage1 --config configs/tiny.yaml [--until pairs|persona_rm|speaker]

Sampling and judging run in shards, pipelined: a shard is judged as soon as it is sampled, while
the next one samples. Each shard is a cached task whose result lives in the run directory, so a
rerun skips every shard already done, and a run killed mid-shard resumes from the request cache.
Training tasks checkpoint periodically; a killed or retried one resumes from its last checkpoint.
Everything, the trainers' logs included, goes to one wandb run per flow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
from prefect.task_runners import ThreadPoolTaskRunner

from mascot import tracking
from mascot.artifacts import Artifact, RunDir
from mascot.config import TINY_MODELS, RunConfig, RunSection, load_config
from mascot.evaluation.before_after import BeforeAfterSettings
from mascot.stage1 import PairSettings, plan_shards
from mascot.train.grpo import SpeakerSettings
from mascot.train.reward_model import RewardModelSettings
from mascot.train.tiny import resolve_model
from tasks import stage1 as steps
from tasks.tracking import publish_stage1_summary

REQUEST_CACHE = "requests.sqlite"
Until = Literal["pairs", "persona_rm", "speaker"]


def resolved_models(config: RunConfig) -> dict[str, str]:
    """Build the tiny models once, up front, and map their references to folders."""
    refs = {config.generation.model, config.models.speaker, config.models.persona_rm,
            *(j.backend.model for j in config.stage1.judges if j.backend)}
    return {ref: resolve_model(ref, config) for ref in refs if ref in TINY_MODELS}


@flow(name="stage1", task_runner=ThreadPoolTaskRunner(max_workers=2))
def stage1(config_path: str, run_name: str | None = None, until: Until = "speaker",
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

    with temporary_settings(updates={PREFECT_LOCAL_STORAGE_PATH: run.prefect_results}), \
            tracking.wandb_run(config, "stage1"):
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

        if until in ("persona_rm", "speaker"):
            rm_settings = RewardModelSettings.of(config, model_paths.get(config.models.persona_rm, config.models.persona_rm))
            artifacts["stage1/persona_rm"] = persona_rm = steps.train_persona_rm(
                rm_settings, pairs, contexts, run.stage1("persona_rm"),
                run.checkpoints("stage1", "persona_rm", rm_settings, pairs, contexts))
        if until == "speaker":
            speaker_model = model_paths.get(config.models.speaker, config.models.speaker)
            speaker_settings = SpeakerSettings.of(config, speaker_model)
            artifacts["stage1/speaker"] = speaker = steps.train_grpo_speaker(
                speaker_settings, contexts, roster, persona_rm, run.stage1("speaker"),
                run.checkpoints("stage1", "speaker", speaker_settings, contexts, persona_rm))
            artifacts["stage1/speaker_eval"] = steps.compare_before_after(
                BeforeAfterSettings.of(config, speaker_model), config.stage1.judges, model_paths, rubric, contexts,
                roster, persona_rm, speaker, cache_path, run.stage1("speaker_eval"))
        run.record(artifacts)
        publish_stage1_summary(config, rubric, artifacts, cache_path)
    return artifacts
