"""The evaluation: MASCOT against named baselines and ablations, on held-out and out-of-domain contexts.

    mascot run evaluate --config configs/tiny.yaml [--refresh]

It reads a finished Stage 2 of the same run (its Directors, one per method trained, and Stage 1's
contexts, candidates, judgments and Speaker). The SFT baseline is trained first (eval/sft/), on Stage 1's
best-judged candidates of training contexts. Evaluation contexts -> every system's conversations (in shards, all in flight under each
backend's one limit) -> the evaluation's own judges and the automatic metrics -> statistics over
contexts; and a pairwise judge on MASCOT against each baseline, in both orders -> eval/report.md
and summary.json. Every request goes through the request cache, so a
killed run resumes without paying for a request twice.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.settings import temporary_settings

from flows.failures import completed, stopped_at_step
from flows.naming import flow_run_name, resume_stage
from flows.runners import step_settings, threads
from mascot import tracking
from mascot.artifacts import Artifact, RunDir, training_seed_name
from mascot.config import RunConfig, load_config
from mascot.config.evaluation import SEEDED_SYSTEMS
from mascot.evaluation.baselines import few_shot_examples
from mascot.evaluation.conversations import ConversationJob
from mascot.evaluation.pairwise import PairwiseJob
from mascot.evaluation.report import ReportSpec, judges_of
from mascot.evaluation.scoring import ScoringJob
from mascot.evaluation.systems import Components, SystemSetup, default_block_tokens, system_setup
from mascot.judges.panel import PanelSpec, judge_rubric_problem
from mascot.roster import load_roster, load_user_profiles
from mascot.rubrics import load_rubric
from mascot.stage2.director import dpo_policy
from mascot.train.grpo import policy_backend
from mascot.train.runtime import adapter_backend
from tasks import evaluate as steps
from tasks.models import build_tiny_models
from tasks.serving import needs_adapter, serve_adapter, serves


@flow(name="evaluate", flow_run_name=flow_run_name("evaluate"), task_runner=threads())
def evaluate(config_path: str, run_name: str | None = None, refresh: bool = False) -> dict[str, Artifact]:
    """Evaluate a config's finished Stage 2 against the baselines; returns the artifacts written.

    `refresh` recomputes every cached step (LLM requests are still answered by the request cache).
    """
    config = load_config(config_path, rubric_problem=judge_rubric_problem)
    if run_name:
        config = config.renamed(run_name)
    if config.eval is None:
        raise ValueError(f"{config_path} has no 'eval' section, so there is nothing to evaluate; see "
                         "configs/tiny.yaml for one")
    run = RunDir(config.run_dir)
    stage1 = {name: run.recorded(f"stage1/{name}", "the evaluation") for name in ("contexts", "candidates", "judgments")}
    directors = trained_directors(run, config_path)
    systems = evaluation_systems(config.eval.systems, directors, config_path)
    speaker = config.eval.speaker or config.stage2.speaker
    adapter = run.recorded("stage1/speaker", "the evaluation's MASCOT") \
        if needs_adapter(speaker) or run.is_recorded("stage1/speaker") else None
    # eval.training_seeds > 1: each further training seed's Speaker and GRPO Director, which MASCOT and its ablations
    # play again (seed 0's are the ones above)
    retrained = [(run.recorded(f"stage1/{training_seed_name('speaker', index)}", f"training seed {index}'s MASCOT"),
                  run.recorded(f"stage2/{training_seed_name('director', index)}", f"training seed {index}'s MASCOT"))
                 for index in range(1, config.training_seeds)]
    run.start(config, Path(config_path), stage=resume_stage("eval"), until="report")
    cache = step_settings(run, refresh)

    with temporary_settings(updates=cache), stopped_at_step("the evaluation", run.root):
        config = build_tiny_models(config)
        evaluation, stage, train = config.eval, config.stage2, config.train
        with tracking.wandb_run(config, "eval"):
            roster, assistant = load_roster(config.data.roster), load_roster(evaluation.assistant)
            artifacts: dict[str, Artifact] = {}
            if "sft" in systems:
                artifacts["eval/sft"] = steps.train_sft_baseline(train.sft, *stage1.values(), assistant,
                                                                       run.path("eval", "sft"))
                run.record(artifacts)
            parts = components(config, adapter, directors, artifacts.get("eval/sft"), run.root)
            # Systems built from the trained Speaker or Director play once more per further training seed.
            again = [components(config, speaker_k, directors | {"grpo": director_k}, None, run.root, index)
                     for index, (speaker_k, director_k) in enumerate(retrained, 1)]
            seeded = [(index, name, own) for index, own in enumerate(again, 1) for name in systems
                      if name in SEEDED_SYSTEMS]
            examples = few_shot_examples(stage1["contexts"], stage1["candidates"], stage1["judgments"],
                                         evaluation.few_shot_examples, config.run.seed)
            users = load_user_profiles(config.data.users).profiles if config.data.users else []
            block_turns = evaluation.block_turns or stage.episodes.block_turns
            block_tokens = evaluation.block_tokens or default_block_tokens(block_turns, parts)
            setups = [system_setup(name, own, roster, assistant, users, block_turns,
                                   stage.episodes.max_directive_attempts, examples, evaluation.self_consistency_samples,
                                   block_tokens=block_tokens, cot_reasoning_tokens=evaluation.cot_reasoning_tokens,
                                   cot_attempts=evaluation.cot_attempts).model_copy(update={"training_seed": index})
                      for index, name, own in [*((0, name, parts) for name in systems), *seeded]]

            contexts = steps.write_eval_contexts(config.data, stage1["contexts"], config.run.seed,
                                                 evaluation.out_of_domain, run.path("eval", "contexts.parquet"))
            ids = contexts.read_parquet()["context_id"].to_list()
            job = ScoringJob(
                persona_panel=PanelSpec.load(evaluation.judges, evaluation.rubric or config.stage1.rubric),
                group_panel=PanelSpec.load(evaluation.group_judges, evaluation.group_rubric or stage.rubric, "block"),
                roster=roster, assistant=assistant, contexts=contexts,
                seed=config.run.seed, requests=config.cache.requests,
                max_judge_failure_rate=evaluation.max_judge_failure_rate)
            # Each conversation shard is judged as soon as it is played, as Stage 1 judges its shards: a request
            # that exhausts its retries fails one shard (its step retries from the request cache), not every
            # request of the evaluation, and only the shards in flight hold rendered prompts.
            size, shards, judged = evaluation.contexts_per_shard, [], []
            for setup in setups:
                for i in range(0, len(ids), size):
                    shards.append(steps.play_conversations.submit(
                        ConversationJob(system=setup, contexts=contexts, seeds=evaluation.seeds,
                                        blocks=evaluation.blocks, requests=config.cache.requests),
                        ids[i:i + size], run.shard("eval", f"conversations-{played_as(setup)}", i // size)))
                    judged.append(steps.judge_conversations.submit(
                        job, shards[-1], run.shard("eval", f"judgments-{played_as(setup)}", i // size)))
            played = steps.merge_conversations(completed(shards), run.path("eval", "conversations.parquet"))
            artifacts |= {"eval/contexts": contexts, "eval/conversations": played}
            run.record(artifacts)
            judgments = steps.merge_judgments(completed(judged), run.path("eval", "judgments.parquet"))
            scores = steps.score_conversations(job, played, judgments, run.path("eval", "scores.parquet"))

            preferences = steps.judge_preferences(
                PairwiseJob(judge=evaluation.pairwise, rubric=job.group_panel.rubric,
                            neutral_rubric=evaluation.neutral_rubric and load_rubric(evaluation.neutral_rubric),
                            roster=job.roster,
                            assistant=job.assistant, contexts=contexts, seed=config.run.seed,
                            requests=config.cache.requests),
                played, run.path("eval", "preferences.parquet"))
            artifacts |= {"eval/judgments": judgments, "eval/scores": scores, "eval/preferences": preferences}
            run.record(artifacts)

            spec = ReportSpec(run=config.run.name, systems=systems, seeds=evaluation.seeds,
                              judges=judges_of(config), confidence=evaluation.confidence,
                              budgets={setup.name: setup.budget for setup in setups},
                              primary=evaluation.primary.model_dump(),
                              resamples=evaluation.bootstrap_resamples, seed=config.run.seed,
                              collective_rubric=job.group_panel.rubric.name, training_seeds=config.training_seeds)
            artifacts |= steps.report_evaluation(spec, contexts, scores, played, preferences, run.path("eval", "report"),
                                                  judgments)
            run.record(artifacts)
    return artifacts


def played_as(setup: SystemSetup) -> str:
    """A system's name in its shards' file names: with its training seed beyond the first (`name-seed1`)."""
    return training_seed_name(setup.name, setup.training_seed)


def components(config: RunConfig, speaker: Artifact | None, directors: dict[str, Artifact],
               sft: Artifact | None, run_root: Path, training_seed: int = 0) -> Components:
    """The roles the systems are built from: the run's adapters on the server where the config names one (loaded
    there, or checked, before any request), else in this process (`speaker` is Stage 1's, `directors` Stage 2's by
    method, `sft` the baseline's). A further training seed's Speaker and Director are served under role names of
    their own (`speaker-seed1`), so that loading one retires no other seed's."""
    evaluation, stage, train = config.eval, config.stage2, config.train
    dpo = directors.get("dpo")

    def served(backend, role: str, adapter: Artifact | None):
        # A role with no adapter in the run is served by hand, or belongs to a system the run does not evaluate.
        wanted = serves(backend) and (adapter is not None or not backend.load_adapter)
        role = training_seed_name(role, training_seed) if role in ("speaker", "director") else role
        return serve_adapter(backend, role, adapter, run_root) if wanted else backend

    return Components(
        base_speaker=config.generation, base_director=stage.director, user=stage.user,
        trained_speaker=served(evaluation.speaker or stage.speaker, "speaker", speaker)
        or policy_backend(train.speaker, speaker.path),
        trained_director=served(evaluation.director, "director", directors["grpo"])
        or policy_backend(train.director, directors["grpo"].path),
        trained_director_dpo=served(evaluation.director_dpo, "director_dpo", dpo)
        or (policy_backend(dpo_policy(train), dpo.path) if dpo else None),
        sft_speaker=served(evaluation.sft, "sft", sft)
        or (adapter_backend(train.sft, sft.path, config.generation.params) if sft else None))


def trained_directors(run: RunDir, config_path: str) -> dict[str, Artifact]:
    """The Directors Stage 2 trained, by method. MASCOT is the GRPO one, the paper's method, so it must be."""
    if not run.is_recorded("stage2/director") and run.is_recorded("stage2/director_dpo"):
        raise FileNotFoundError(
            f"run {run.root} trained only a DPO Director, but the evaluation's MASCOT is the GRPO one (the paper's "
            f"method): run `mascot run stage2 --config {config_path}` with the same run name to train it; MASCOT with "
            "the DPO Director is then evaluated beside it")
    directors = {"grpo": run.recorded("stage2/director", "the evaluation's MASCOT")}
    if run.is_recorded("stage2/director_dpo"):
        directors["dpo"] = run.recorded("stage2/director_dpo", "the evaluation's MASCOT with the DPO Director")
    return directors


def evaluation_systems(listed: list[str], directors: dict[str, Artifact], config_path: str) -> list[str]:
    """The systems played: those listed, with MASCOT for each Director method trained (after 'mascot')."""
    if "mascot_dpo" in listed and "dpo" not in directors:
        raise FileNotFoundError(f"eval.systems lists 'mascot_dpo', but this run trained no DPO Director: run "
                                f"`mascot run stage2 --config {config_path} --director-method dpo` first, or drop it")
    if "dpo" in directors and "mascot_dpo" not in listed:
        at = listed.index("mascot") + 1
        return [*listed[:at], "mascot_dpo", *listed[at:]]
    return list(listed)
