"""Stage 2, collaborative dialogue: branched episodes -> group judge -> trajectory pairs -> group reward
model -> Director (GRPO over trajectories, or DPO) -> the Director before/after on held-out states.

    mascot run stage2 --config configs/tiny.yaml [--director-method grpo|dpo] [--refresh]

It reads the contexts and the Speaker adapter of the same run's finished Stage 1. Episodes are
generated in shards, all in flight at once under each backend's one limit for the whole flow run;
each shard is a cached task, and every request goes through the request cache, so a killed run
resumes without repeating a request. GRPO against the group reward model is the default and the
paper's method; `dpo` trains the Director on the branches' directive pairs instead, an alternative
that is not the paper's method. Both are evaluated the same way. One wandb run per flow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.settings import temporary_settings

from flows.failures import completed, stopped_at_step
from flows.naming import flow_run_name, resume_stage
from flows.runners import step_settings, threads
from mascot import tracking
from mascot.artifacts import Artifact, RunDir, training_seed_name
from mascot.config import load_config
from mascot.judges.panel import PanelSpec, judge_rubric_problem
from mascot.roster import load_roster, load_user_profiles
from mascot.stage2.branching import CastSpec, Setting
from mascot.stage2.director import DIRECTORS, dpo_policy
from mascot.stage2.director_eval import Directors
from mascot.train.grpo import policy_backend, served_policy
from tasks import stage2 as steps
from tasks.models import build_tiny_models
from tasks.serving import needs_adapter, serve_adapter, serves
from tasks.tracking import report_stage2

DirectorMethod = Literal["grpo", "dpo"]


@flow(name="stage2", flow_run_name=flow_run_name("stage2"), task_runner=threads())
def stage2(config_path: str, run_name: str | None = None, director_method: DirectorMethod = "grpo",
           refresh: bool = False) -> dict[str, Artifact]:
    """Run Stage 2 of a config on its finished Stage 1; returns the artifacts written.

    `director_method`: "grpo" (default, the paper's method) or "dpo" (an alternative, not the paper's).
    `refresh` recomputes every cached step (LLM requests are still answered by the request cache).
    """
    config = load_config(config_path, rubric_problem=judge_rubric_problem)
    if run_name:
        config = config.renamed(run_name)
    if config.stage2 is None:
        raise ValueError(f"{config_path} has no 'stage2' section, so there is no Stage 2 to run; see "
                         "configs/tiny.yaml for one")
    if director_method == "dpo" and config.train.director_dpo is None:
        raise ValueError(f"--director-method dpo trains train.director_dpo, which {config_path} does not have")
    run = RunDir(config.run_dir)
    contexts = run.recorded("stage1/contexts", "stage 2")
    # The Speaker is the Stage 1 adapter: in this process, or on the configured server (loaded there, or checked).
    adapter = run.recorded("stage1/speaker", "stage 2's Speaker") \
        if needs_adapter(config.stage2.speaker) or run.is_recorded("stage1/speaker") else None
    run.start(config, Path(config_path), stage=resume_stage("stage2"), until=director_method)
    cache = step_settings(run, refresh)

    with temporary_settings(updates=cache), stopped_at_step("stage 2", run.root):
        config = build_tiny_models(config)
        train, stage = config.train, config.stage2
        users = load_user_profiles(config.data.users).profiles if config.data.users else []
        speaker = serve_adapter(stage.speaker, "speaker", adapter, run.root) if serves(stage.speaker) \
            else stage.speaker or policy_backend(train.speaker, adapter.path)
        cast = CastSpec(roster=load_roster(config.data.roster), director=stage.director, speaker=speaker, user=stage.user,
                        profiles=users, max_directive_attempts=stage.episodes.max_directive_attempts)
        setting = Setting(cast=cast, episodes=stage.episodes, seed=config.run.seed, contexts=contexts,
                          requests=config.cache.requests)
        panel = PanelSpec.load(stage.judges, stage.rubric, level="block")
        ids = contexts.read_parquet()["context_id"].to_list()
        size = stage.episodes.contexts_per_shard
        shards = [steps.generate_episodes.submit(setting, ids[i:i + size], run.shard("stage2", "episodes", i // size))
                  for i in range(0, len(ids), size)]
        with tracking.wandb_run(config, "stage2"):
            episodes = steps.merge_episodes(completed(shards), run.path("stage2", "episodes.parquet"))
            judgments = steps.judge_trajectories(panel, setting, episodes, run.path("stage2", "judgments.parquet"))
            pairs = steps.build_group_pairs(stage, cast.roster, episodes, contexts, judgments,
                                            run.path("stage2", "pairs.parquet"))
            artifacts = {"stage2/episodes": episodes, "stage2/judgments": judgments, "stage2/pairs": pairs}
            run.record(artifacts)

            artifacts["stage2/group_rm"] = group_rm = steps.train_group_rm(train.group_rm, pairs, contexts,
                                                                             run.path("stage2", "group_rm"))
            run.record(artifacts)
            name = DIRECTORS[director_method]  # each method's Director has its own folder: both can be evaluated
            if director_method == "grpo":
                director = steps.train_director(train.director, setting, episodes, group_rm, run.path("stage2", name))
                policy = train.director
                # eval.training_seeds > 1: the group trained again, each Director with its own seed's Speaker in
                # its rollouts, from the same episodes and group reward model, beside the first
                for index in range(1, config.training_seeds):
                    seeded, role = training_seed_name(name, index), training_seed_name("speaker", index)
                    own = run.recorded(f"stage1/{role}", f"stage 2's Director of training seed {index}")
                    speaker_k = serve_adapter(stage.speaker, role, own, run.root) if serves(stage.speaker) \
                        else stage.speaker or policy_backend(train.speaker, own.path)
                    rollouts = setting.model_copy(update={"cast": cast.model_copy(update={"speaker": speaker_k})})
                    artifacts[f"stage2/{seeded}"] = steps.train_director(
                        train.director.reseeded(index), rollouts, episodes, group_rm, run.path("stage2", seeded))
            else:
                director = steps.train_director_dpo(train.director_dpo, pairs, contexts, stage.episodes,
                                                    run.path("stage2", name))
                policy = dpo_policy(train)
            artifacts[f"stage2/{name}"] = director
            run.record(artifacts)
            # On the serving engine where it loads adapters: no copy of the policy's base model in this process.
            directors = Directors(policy=policy, adapter=director, weights=train.director.reward_weights,
                                  server=served_policy(policy, stage.director), role=name)
            scored = steps.evaluate_directors(train.director_eval, directors, setting, episodes, group_rm,
                                              run.path("stage2", f"{name}_eval-scored.parquet"))
            artifacts[f"stage2/{name}_eval"] = steps.compare_directors(train.director_eval, config.run.seed, scored,
                                                                       contexts, run.path("stage2", f"{name}_eval"))
            artifacts |= report_stage2(config.run.name, panel.rubric, stage.aggregation, director_method, artifacts, contexts,
                                       config.cache.requests, run.path("stage2", "report"))
            run.record(artifacts)
    return artifacts
