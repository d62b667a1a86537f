"""Stage 1, persona alignment: contexts -> K candidates -> judge panel -> preference pairs
-> persona reward model -> GRPO Speaker -> before/after comparison on held-out prompts.

    mascot run stage1 --config configs/tiny.yaml [--until pairs|persona_rm|speaker] [--refresh]

Sampling and judging run in shards, pipelined. Every shard's sampling starts at once, and each
backend's `max_concurrency` bounds the requests in flight for the whole run (`mascot.llm.limits`),
first come first served, so the first shard is answered first. A shard is judged as soon as it is
sampled, while later shards still sample; judging the last shard is all that is left after the
last sample. Each shard is a cached task whose output is named by its cache key, so a rerun skips
every shard already done, and a run killed mid-shard resumes from the request cache. Training
tasks checkpoint periodically; a killed or retried one resumes from its last checkpoint.
Everything, the trainers' logs included, goes to one wandb run per flow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from prefect import flow
from prefect.settings import temporary_settings

from flows.failures import completed, stopped_at_step
from flows.naming import flow_run_name, resume_stage
from flows.runners import step_settings, threads
from mascot import tracking
from mascot.artifacts import Artifact, RunDir, training_seed_name
from mascot.config import load_config
from mascot.judges.panel import PanelSpec, judge_rubric_problem
from mascot.queries import Queries
from mascot.roster import load_roster
from tasks import stage1 as steps
from tasks.models import build_tiny_models
from tasks.tracking import report_stage1

Until = Literal["pairs", "persona_rm", "speaker"]
STEPS = get_args(Until)  # in order: a later one's report describes more

@flow(name="stage1", flow_run_name=flow_run_name("stage1"), task_runner=threads())
def stage1(config_path: str, run_name: str | None = None, until: Until = "speaker",
           refresh: bool = False) -> dict[str, Artifact]:
    """Run Stage 1 of a config up to `until`; returns the artifacts written.

    `refresh` recomputes every cached step (LLM requests are still answered by the request cache).
    """
    # The judges' check covers Stage 2's judges too: a config whose Stage 2 cannot run stops before Stage 1.
    config = load_config(config_path, rubric_problem=judge_rubric_problem)
    if run_name:
        config = config.renamed(run_name)
    run = RunDir(config.run_dir)
    run.start(config, Path(config_path), stage=resume_stage("stage1"), until=until)
    # With `refresh`, every cached task recomputes and overwrites its cache record: the steps downstream
    # of a refreshed one are refreshed too, so none can return a result that names a replaced file.
    cache = step_settings(run, refresh)

    with temporary_settings(updates=cache), stopped_at_step("stage 1", run.root):
        # Built once, as the first step, so that every step gets loadable folders; trainers' models only when
        # training.
        config = build_tiny_models(config, trainers=until != "pairs", stage2=False)
        seed, requests, train = config.run.seed, config.cache.requests, config.train
        panel = PanelSpec.load(config.stage1.judges, config.stage1.rubric)
        contexts = steps.write_contexts(config.data, seed, run.path("stage1", "contexts.parquet"))
        queries = Queries(contexts=contexts, roster=load_roster(config.data.roster))
        sampled, judged = [], []
        for index, shard in enumerate(queries.shards(config.stage1.shard_size)):
            replies = steps.sample_candidates.submit(config.generation, config.stage1.k, seed, shard, requests,
                                                     run.shard("stage1", "candidates", index))
            sampled.append(replies)
            judged.append(steps.judge_candidates.submit(panel, seed, shard, replies, requests,
                                                        run.shard("stage1", "judgments", index)))
        # wandb starts (in the background) once the first shard is sampled: its second of imports would
        # otherwise compete with the shards' start. A run whose first shard was cached starts it only if
        # something logs: a rerun that computes nothing leaves no empty wandb run behind.
        first = sampled[0] if sampled else None
        if first is not None:
            first.wait()
        with tracking.wandb_run(config, "stage1", start=first is not None and first.state.name != "Cached"):
            candidates = steps.merge_shards(completed(sampled), run.path("stage1", "candidates.parquet"))
            judgments = steps.merge_shards(completed(judged), run.path("stage1", "judgments.parquet"))
            pairs = steps.build_pairs(config.stage1, queries, candidates, judgments,
                                      run.path("stage1", "pairs.parquet"))
            artifacts = {"stage1/contexts": contexts, "stage1/candidates": candidates, "stage1/judgments": judgments,
                         "stage1/pairs": pairs}
            run.record(artifacts)

            if until in ("persona_rm", "speaker"):
                artifacts["stage1/persona_rm"] = persona_rm = steps.train_persona_rm(
                    train.persona_rm, pairs, contexts, run.path("stage1", "persona_rm"))
                run.record(artifacts)
            if until == "speaker":
                artifacts["stage1/speaker"] = speaker = steps.train_speaker(
                    train.speaker, queries, persona_rm, run.path("stage1", "speaker"))
                # eval.training_seeds > 1: the same training again under seeds offset by 1..N-1, beside the first
                for index in range(1, config.training_seeds):
                    name = training_seed_name("speaker", index)
                    artifacts[f"stage1/{name}"] = steps.train_speaker(
                        train.speaker.reseeded(index), queries, persona_rm, run.path("stage1", name))
                run.record(artifacts)
                held_out = queries.held_out()
                samples = steps.sample_policies(train.speaker, train.before_after, held_out, speaker, requests,
                                                run.path("stage1", "speaker_eval-samples.parquet"))
                scored = steps.score_replies(train.speaker, held_out, persona_rm, samples,
                                             run.path("stage1", "speaker_eval-scored.parquet"))
                judged_samples = steps.judge_candidates(panel, seed, held_out, samples, requests,
                                                        run.path("stage1", "speaker_eval-judgments.parquet"))
                artifacts["stage1/speaker_eval"] = steps.compare_policies(
                    train.before_after, seed, scored, judged_samples, contexts, run.path("stage1", "speaker_eval"))
            run.record(artifacts)
            # A partial rerun of a run whose report went further reports beside it, never over it.
            partial = until if run.describes_beyond("stage1", until, STEPS) else None
            report = report_stage1(config.run.name, panel.rubric, artifacts, requests, run.path("stage1", "report"),
                                   partial)
            artifacts |= run.record_report("stage1", until, STEPS, report)
    return artifacts
