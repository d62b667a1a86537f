"""`mascot plan` on both paper profiles, against counts worked out by hand from their YAML.

configs/paper.yaml: 2,000 contexts (corpus.limit), 200 held out (ceil(0.1 x 2,000)), 1,800 train; 3 personas; K=8.
configs/paper_meetings.yaml: 1,500 windows, 150 held out, 1,350 train; 4 personas; the rest as paper.yaml.
Stage 2: 3 turns a block, no prefix block (the state is the opening), 1 state, 4 branches of 3 blocks, a user turn
after each block: 36 turns and 12 user turns an episode. The Director: 300 steps x 8 x 4 completions x 4 rollouts = 38,400
trajectories of 9 turns, the first directive sampled by GRPO and 8 made by the policy's snapshot, which the
flow loads into the base Director's server (stage2.director says load_adapter).
The evaluation: 10 systems (4 groups, 6 single assistants) x the held-out contexts and data.held_out's limit of 1,300
x 3 seeds; 3 blocks, 3 companion turns a block for a group, 1 for a single assistant, the user's turn between two.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from mascot import plan
from mascot.config import RunConfig
from mascot.yamlio import YamlDocument, validate_document

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _config(name: str) -> RunConfig:
    path = REPO / "configs" / name
    return validate_document(YamlDocument.read(path), RunConfig, context={"base_dir": path.parent})


def _by_step(work: list[plan.Work]) -> dict[str, plan.Work]:
    return {item.step: item for item in work}


# profile: (contexts, held out, personas, episode turns, user turns, trajectories judged, before/after rollouts,
#           persona RM steps at most, group RM steps at most, SFT steps at most)
# SFT: one example per training context (its best-judged candidate), 32 a step (8 x 4), 2 epochs:
#   paper.yaml ceil(1,800 / 32) = 57 x 2 = 114; paper_meetings.yaml ceil(1,350 / 32) = 43 x 2 = 86
PROFILES = {
    "paper.yaml": (2000, 200, 3, 72_000, 24_000, 8_000, 1_600, 4_725, 338, 114),
    "paper_meetings.yaml": (1500, 150, 4, 54_000, 18_000, 6_000, 1_200, 4_725, 254, 86),
}


@pytest.mark.parametrize("profile", PROFILES)
def test_requests_and_steps_match_the_counts_by_hand(profile):
    contexts, held, personas, turns, users, judged, compared, persona_rm, group_rm, sft = PROFILES[profile]
    config = _config(profile)
    counts = plan.counts(config, personas)
    assert (counts.contexts, counts.held_out, counts.train) == (contexts, held, contexts - held)
    work = _by_step(plan.requests(config, counts, plan.GUESSED_RATES))
    # Stage 1: 6,000 queries with n=8 each; every judge scores every candidate, and the before/after's replies
    sample = work["sample candidates"]
    assert (sample.requests, sample.completions, sample.max_output_tokens) == (6_000, 48_000, 48_000 * 256)
    for judge in ("gpt-4o", "gemma-3-27b", "phi-4"):
        assert work[f"judge ({judge})"].requests == 48_000
        assert work[f"before/after judge ({judge})"].requests == held * personas * 1 * 2
    assert work["judge (gpt-4o)"].api and not work["judge (phi-4)"].api
    # Stage 2
    assert work["episodes: directives (at least)"].requests == turns == contexts * 36
    assert work["episodes: replies"].requests == turns
    assert work["episodes: user turns"].requests == users == contexts * 12
    assert work["group judge (gpt-4o)"].requests == judged == contexts * 4
    assert work["director GRPO rollouts: directives"].requests == 38_400 * 8
    assert work["director GRPO rollouts: replies"].requests == 38_400 * 9
    assert work["director GRPO rollouts: user turns"].requests == 38_400 * 3
    assert work["director GRPO rollouts: directives"].backend == "Qwen/Qwen3-8B @ http://127.0.0.1:8000/v1"
    assert work["director before/after rollouts: directives"].backend == "Qwen/Qwen3-8B @ http://127.0.0.1:8000/v1"
    assert work["director before/after rollouts: directives"].requests == compared * 8
    steps = {step.name: step for step in plan.training(config, counts)}
    assert (steps["persona_rm"].steps, steps["persona_rm"].upper_bound) == (persona_rm, True)
    assert (steps["speaker"].steps, steps["director"].steps) == (500, 300)
    assert steps["group_rm"].steps == group_rm
    assert (steps["sft"].steps, steps["sft"].upper_bound) == (sft, True)


GROUPS = ("mascot", "multi_agent", "mascot_p", "mascot_c")
SINGLES = ("zero_shot", "zero_shot_cot", "few_shot", "few_shot_cot", "sft", "self_consistency")
SERVED = "Qwen/Qwen3-8B @ http://127.0.0.1:8000/v1"


@pytest.mark.parametrize("profile", PROFILES)
def test_the_evaluations_requests_match_the_counts_by_hand(profile):
    _, held, personas = PROFILES[profile][:3]
    config = _config(profile)
    counts = plan.counts(config, personas)
    work = _by_step(plan.requests(config, counts, plan.GUESSED_RATES))
    # Every system plays every evaluation context once per seed: the held-out contexts, then ESConv's (or QMSum
    # test's) limit of 1,300 (data.held_out[0].limit, eval.out_of_domain true), each for 3 seeds (eval.seeds).
    assert counts.evaluated == held + 1_300
    conversations = (held + 1_300) * 3
    # A conversation is 3 blocks (eval.blocks); a group answers a block with 3 companion turns
    # (stage2.episodes.block_turns), a single assistant with 1; the user speaks between two blocks: 2 turns.
    group_turns, single_turns, user_turns = 3 * 3, 3 * 1, 3 - 1
    # The block's 768 tokens (3 turns x the Speaker's 256): a group's turn 256, a single assistant's reply 768
    for system in GROUPS:
        directives, replies = work[f"{system}: directives (at least)"], work[f"{system}: replies"]
        assert directives.requests == replies.requests == conversations * group_turns
        assert directives.max_output_tokens == conversations * group_turns * 128  # eval.director, stage2.director
        assert replies.max_output_tokens == conversations * group_turns * 256
        assert directives.backend == replies.backend == SERVED
    for system in SINGLES:
        assert f"{system}: directives (at least)" not in work  # a scripted Director asks nothing
    for system in ("zero_shot", "few_shot", "sft"):
        replies = work[f"{system}: replies"]
        assert (replies.requests, replies.completions) == (conversations * single_turns,) * 2
        assert replies.max_output_tokens == conversations * single_turns * 768
    assert work["sft: replies"].backend == "Qwen/Qwen3-8B (in-process)"  # train.sft's adapter, eval.sft unset
    for system in ("zero_shot_cot", "few_shot_cot"):
        # up to 3 samplings a turn (eval.cot_attempts), each of 768 + 256 reasoning tokens (cot_reasoning_tokens)
        replies = work[f"{system}: replies (at most)"]
        assert replies.requests == conversations * single_turns * 3
        assert replies.max_output_tokens == conversations * single_turns * 3 * (768 + 256)
    consistency = work["self_consistency: replies"]  # 5 replies in one request (self_consistency_samples)
    assert (consistency.requests, consistency.completions) == (conversations * single_turns,
                                                               conversations * single_turns * 5)
    for system in (*GROUPS, *SINGLES):
        assert work[f"{system}: user turns"].requests == conversations * user_turns
    # Scoring: each of the 3 persona-level judges reads every companion turn of every system's conversations,
    # each of the 3 collective judges every conversation, and the pairwise judge the 9 baselines against MASCOT
    # on every context and seed, in both orders.
    for judge in ("gpt-4o", "gemma-3-27b", "phi-4"):
        assert work[f"eval judge ({judge})"].requests == conversations * (4 * group_turns + 6 * single_turns)
        assert work[f"eval group judge ({judge})"].requests == conversations * 10
    pairwise = work["pairwise judge (llama-3.3-70b, both orders)"]
    assert pairwise.requests == 9 * conversations * 2
    assert not pairwise.api and work["eval judge (gpt-4o)"].api
    assert {item.stage for item in work.values() if item.step.startswith(("eval judge", "pairwise"))} == {"eval"}


def test_the_evaluation_without_out_of_domain_with_the_other_systems_and_one_block():
    config = _config("paper.yaml")
    config = config.model_copy(update={"eval": config.eval.model_copy(update={
        "out_of_domain": False, "blocks": 1, "block_turns": 2, "block_tokens": 200,
        "systems": ["mascot", "mascot_dpo", "mascot_c_generic", "zero_shot"]})})
    counts = plan.counts(config, 3)
    assert (counts.out_of_domain, counts.evaluated) == (0, 200)
    work = _by_step(plan.requests(config, counts, plan.GUESSED_RATES))
    conversations = 200 * 3  # the held-out contexts only, x 3 seeds
    assert work["mascot: directives (at least)"].requests == conversations * 2  # 1 block of 2 turns (eval.block_turns)
    # eval.block_tokens 200: a group's turn 100 tokens, the single assistant's one reply all 200
    assert work["mascot: replies"].max_output_tokens == conversations * 2 * 100
    assert work["zero_shot: replies"].max_output_tokens == conversations * 1 * 200
    # MASCOT with the DPO Director: train.director_dpo's model in this process (eval.director_dpo unset)
    assert work["mascot_dpo: directives (at least)"].backend == "Qwen/Qwen3-8B (in-process)"
    assert "mascot_c_generic: directives (at least)" not in work  # a random persona and the generic instruction
    assert work["mascot_c_generic: replies"].requests == conversations * 2
    assert not any(step.endswith("user turns") for step in work if work[step].stage == "eval")  # one block
    assert work["pairwise judge (llama-3.3-70b, both orders)"].requests == 3 * conversations * 2
    steps = {step.name for step in plan.training(config, counts)}
    assert "sft" not in steps  # the SFT baseline is trained only where it is evaluated


def test_three_training_seeds_train_the_grpo_policies_and_play_their_systems_three_times():
    config = _config("paper.yaml")
    counts = plan.counts(config, 3)
    once = _by_step(plan.requests(config, counts, plan.GUESSED_RATES))
    steps_once = {step.name: step for step in plan.training(config, counts)}
    hours_once = plan.gpu_hours(list(once.values()), list(steps_once.values()), plan.GUESSED_RATES)
    config = config.model_copy(update={"eval": config.eval.model_copy(update={"training_seeds": 3})})
    work = _by_step(plan.requests(config, counts, plan.GUESSED_RATES))
    steps = {step.name: step for step in plan.training(config, counts)}
    # The Speaker's GRPO and the GRPO Director train three times, each run its max_steps; the reward models and the
    # SFT baseline once.
    assert {name: step.runs for name, step in steps.items()} == {"persona_rm": 1, "speaker": 3, "group_rm": 1,
                                                                 "director": 3, "sft": 1}
    assert (steps["speaker"].steps, steps["director"].steps) == (500, 300)
    # The Director's rollouts are asked once per run; its before/after (the first run's) once.
    assert work["director GRPO rollouts: directives"].requests == 3 * 38_400 * 8
    assert work["director before/after rollouts: directives"].requests == \
        once["director before/after rollouts: directives"].requests
    # MASCOT and its ablations play every context and seed once per run; the untrained group and the single
    # assistants once; each of MASCOT's runs meets each of the 9 baselines before the pairwise judge.
    conversations = (200 + 1_300) * 3
    for system in ("mascot", "mascot_p", "mascot_c"):
        assert work[f"{system}: replies"].requests == 3 * conversations * 9
        assert work[f"{system}: user turns"].requests == 3 * conversations * 2
    for system in ("multi_agent",):
        assert work[f"{system}: replies"].requests == conversations * 9
    assert work["zero_shot: replies"].requests == conversations * 3
    assert work["eval judge (gpt-4o)"].requests == conversations * (3 * 3 * 9 + 9 + 6 * 3)
    assert work["eval group judge (gpt-4o)"].requests == conversations * (3 * 3 + 1 + 6)
    assert work["pairwise judge (llama-3.3-70b, both orders)"].requests == 9 * 3 * conversations * 2
    # GPU-hours: two more runs of the Speaker (500 steps x 40 s) and of the Director (300 x 180 s) on top of the
    # served tokens of the extra rollouts and conversations.
    hours = plan.gpu_hours(list(work.values()), list(steps.values()), plan.GUESSED_RATES)
    extra_training = {"stage1": 2 * 500 * 40 / 3600, "stage2": 2 * 300 * 180 / 3600}
    assert hours["stage1"] == pytest.approx(hours_once["stage1"] + extra_training["stage1"])
    assert hours["stage2"] > hours_once["stage2"] + extra_training["stage2"]
    assert hours["eval"] > hours_once["eval"]


def test_the_tiny_profiles_evaluation_by_hand():
    config = _config("tiny.yaml")
    counts = plan.counts(config, 3)
    work = _by_step(plan.requests(config, counts, plan.GUESSED_RATES))
    # 10 held-out contexts (ceil(0.25 x 40)) and the ESConv sample's 12 (data.held_out[0].limit), 1 seed
    conversations = (10 + 12) * 1
    group_turns, single_turns, user_turns = 2 * 2, 2 * 1, 2 - 1  # 2 blocks, 2 turns a group's block
    # The block's 80 tokens: 2 turns x the trained Speaker's 40 (train.speaker.max_completion_length, in this process)
    for system in GROUPS:
        assert work[f"{system}: directives (at least)"].requests == conversations * group_turns
        assert work[f"{system}: replies"].max_output_tokens == conversations * group_turns * 40
    assert work["zero_shot: replies"].max_output_tokens == conversations * single_turns * 80
    cot = work["few_shot_cot: replies (at most)"]  # 1 sampling a turn (cot_attempts), 80 + 16 reasoning tokens
    assert (cot.requests, cot.max_output_tokens) == (conversations * single_turns, conversations * single_turns * 96)
    assert work["self_consistency: replies"].completions == conversations * single_turns * 4
    assert work["sft: user turns"].requests == conversations * user_turns
    # Its judges are heuristic: they ask no model, so no judging row and no API cost
    assert not [step for step in work if step.startswith(("eval judge", "eval group judge", "pairwise"))]
    assert plan.api_costs_by_stage(list(work.values()), config.plan.prices) == {}
    sft = {step.name: step for step in plan.training(config, counts)}["sft"]
    assert (sft.steps, sft.upper_bound) == (math.ceil(30 / 8) * 3, True)  # 30 training contexts, 8 a step, 3 epochs


def test_the_api_judges_cost_at_the_configs_list_price():
    config = _config("paper.yaml")
    work = plan.requests(config, plan.counts(config, 3), plan.GUESSED_RATES)
    # gpt-4o at $2.50 / $10 per million tokens; prompts at the guessed 1,200 (a reply) and 2,500 (a trajectory)
    # tokens, completions at max_new_tokens 768:
    #   Stage 1 judging   48,000 x (1,200 x 2.5 + 768 x 10) / 1e6 = 144 + 368.64
    #   before/after       1,200 x (1,200 x 2.5 + 768 x 10) / 1e6 = 3.6 + 9.216
    #   group judging      8,000 x (2,500 x 2.5 + 768 x 10) / 1e6 = 50 + 61.44
    # The evaluation, 4,500 conversations a system ((200 + 1,300) contexts x 3 seeds):
    #   persona judging  243,000 companion turns (4,500 x (4 groups x 9 + 6 assistants x 3)) x 10.68e-3 = 2,595.24
    #   collective        45,000 conversations (4,500 x 10 systems) x (2,500 x 2.5 + 768 x 10) / 1e6 = 626.85
    stage1, stage2, evaluation = 525.456, 111.44, 2_595.24 + 626.85
    by_stage = plan.api_costs_by_stage(work, config.plan.prices)
    assert by_stage == {"stage1": {"gpt-4o-2024-08-06": pytest.approx(stage1)},
                        "stage2": {"gpt-4o-2024-08-06": pytest.approx(stage2)},
                        "eval": {"gpt-4o-2024-08-06": pytest.approx(evaluation)}}
    assert plan.api_costs(work, config.plan.prices) == {"gpt-4o-2024-08-06": pytest.approx(stage1 + stage2
                                                                                            + evaluation)}
    assert plan.api_costs(work, {}) == {"gpt-4o-2024-08-06": None}


def test_parameters_and_memory_are_counted_on_the_meta_device():
    eight_b = plan.model_shape("Qwen/Qwen3-8B")
    # embeddings and untied head 2 x 151,936 x 4,096; 36 layers of q, o 4,096^2, k, v 4,096 x 1,024, the MLP
    # 3 x 4,096 x 12,288, norms 2 x 4,096 + 2 x 128; the final norm 4,096
    assert eight_b.total == 2 * 151_936 * 4_096 + 36 * 192_946_432 + 4_096 == 8_190_735_360
    # LoRA r16 on q, k, v, o: 16 x (8,192 + 5,120 + 5,120 + 8,192) a layer
    assert eight_b.lora(16, ["q_proj", "k_proj", "v_proj", "o_proj"]) == 36 * 425_984
    small = plan.model_shape("Qwen/Qwen3-0.6B")
    # tied embedding 151,936 x 1,024; 28 layers of 15,730,944; the final norm; as a classifier, a 1,024 score head
    assert small.classifier == 151_936 * 1_024 + 28 * 15_730_944 + 1_024 + 1_024 == 596_050_944
    rows = {row.name: row for row in plan.memory(_config("paper.yaml"))}
    assert rows["persona_rm"].total == 16 * 596_050_944
    speaker = rows["speaker"]
    assert (speaker.trained_bytes, speaker.frozen_bytes) == (16 * 36 * 425_984, 2 * 8_190_735_360)
    assert speaker.engine_bytes == int(0.35 * 80e9) and speaker.scorer_bytes == 4 * 596_050_944
    # the Director's later directives are its snapshots on the server: beside its policy only the group RM
    assert rows["director"].scorer_bytes == 4 * 596_050_944
    # where its server loads no adapters, an in-process, merged copy of its policy joins it for later directives
    config = _config("paper.yaml")
    config.stage2.director = config.stage2.director.model_copy(update={"load_adapter": False})
    in_process = {row.name: row for row in plan.memory(config)}["director"]
    assert in_process.scorer_bytes == 4 * 596_050_944 + 2 * 8_190_735_360
    by_step = _by_step(plan.requests(config, plan.counts(config, 3), plan.GUESSED_RATES))
    assert by_step["director GRPO rollouts: directives"].backend == "Qwen/Qwen3-8B (in-process)"
    assert plan.model_shape("some/unknown-model") is None


def test_each_stage_has_its_busiest_server_and_its_training_hours_by_hand():
    config = _config("paper.yaml")
    counts = plan.counts(config, 3)
    work, steps = plan.requests(config, counts, plan.GUESSED_RATES), plan.training(config, counts)
    served = plan.served_hours(work, plan.GUESSED_RATES)
    gemma = "google/gemma-3-27b-it @ http://127.0.0.1:8001/v1"
    # Gemma (900 tokens/s guessed) writes at most 768 tokens a judgment: in Stage 1 for the 48,000 candidates and the
    # 1,200 before/after samples; in the evaluation for 243,000 companion turns and 45,000 conversations.
    assert served["stage1"][gemma] == pytest.approx((48_000 + 1_200) * 768 / 900 / 3600)
    assert served["eval"][gemma] == pytest.approx((243_000 + 45_000) * 768 / 900 / 3600)  # 68.3 h
    assert max(served["eval"].values()) == served["eval"][gemma]  # one Gemma server bounds the evaluation
    phi = "microsoft/phi-4 @ http://127.0.0.1:8002/v1"  # 1,600 tokens/s guessed: 38.4 h, the evaluation's next
    assert served["eval"][phi] == pytest.approx((243_000 + 45_000) * 768 / 1600 / 3600)
    assert sorted(served["eval"].values())[-2] == served["eval"][phi]
    # Training, each stage's steps one after another: the persona RM's 4,725 steps at 1 s and the Speaker's 500 at
    # 40 s; the group RM's 338 at 1 s and the Director's 300 at 180 s; the SFT baseline's 114 at 20 s.
    assert plan.training_hours(steps, plan.GUESSED_RATES) == pytest.approx(
        {"stage1": (4_725 + 500 * 40) / 3600, "stage2": (338 + 300 * 180) / 3600, "eval": 114 * 20 / 3600})
    # GPU-hours are the servers' hours and the training's (one process each here).
    training = plan.training_hours(steps, plan.GUESSED_RATES)
    assert plan.gpu_hours(work, steps, plan.GUESSED_RATES) == pytest.approx(
        {stage: sum(by_backend.values()) + training[stage] for stage, by_backend in served.items()})


def test_the_command_prints_its_tables_and_refuses_a_config_without_a_limit(tmp_path):
    result = runner.invoke(app, ["plan", "--config", str(REPO / "configs" / "paper.yaml")], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    evaluated = "10 systems x 1,500 contexts (200 held out, 1,300 of data.held_out) x 3 seeds"
    for fragment in ("2,000 contexts (200 held out) x 3 personas", "at most 4,725", "525", "GPU-hours",
                     "guessed rates", "47.0", evaluated, "mascot: directives (at least)", "3,222", "3,859", "at most 114"):
        assert fragment in result.output, fragment
    assert re.search(r"│ eval +│ +\d", result.output), "no GPU-hours row for the evaluation"
    assert re.search(r"│ eval +│ +141\.6 │ google/gemma-3-27b-it: 68\.3 +│ +0\.6 │", result.output), result.output
    text = (REPO / "configs" / "paper.yaml").read_text()
    unlimited = tmp_path / "configs" / "unlimited.yaml"
    unlimited.parent.mkdir()
    unlimited.write_text(re.sub(r"(?m)^    limit: 2000\n", "", text).replace("rosters/", f"{REPO}/configs/rosters/"))
    result = runner.invoke(app, ["plan", "--config", str(unlimited)])
    assert result.exit_code == 2 and "data.corpus.limit is not set" in result.output, result.output
    assert "Traceback" not in result.output
    # Nor does it read an out-of-domain corpus the evaluation would play whole.
    unlimited.write_text(text.replace("      limit: 1300", "      # limit: 1300").replace(
        "rosters/", f"{REPO}/configs/rosters/"))
    result = runner.invoke(app, ["plan", "--config", str(unlimited)])
    assert result.exit_code == 2 and "data.held_out[0].limit is not set" in result.output, result.output
    assert "--config" in runner.invoke(app, ["plan", "--help"]).output
