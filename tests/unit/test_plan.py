"""`mascot plan` on both paper profiles, against counts worked out by hand from their YAML.

configs/paper.yaml: 2,000 contexts (corpus.limit), 200 held out (ceil(0.1 x 2,000)), 1,800 train; 3 personas; K=8.
configs/paper_meetings.yaml: 1,500 windows, 150 held out, 1,350 train; 4 personas; the rest as paper.yaml.
Stage 2: 3 turns a block, 1 prefix block, 1 state, 4 branches of 3 blocks, a user turn after each block:
39 turns and 13 user turns an episode. The Director: 300 steps x 8 x 4 completions x 4 rollouts = 38,400
trajectories of 9 turns, the first directive sampled by GRPO and 8 made by the policy in-process.
"""

from __future__ import annotations

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
#           persona RM steps at most, group RM steps at most, SFT steps)
PROFILES = {
    "paper.yaml": (2000, 200, 3, 78_000, 26_000, 8_000, 1_600, 4_725, 338, 338),
    "paper_meetings.yaml": (1500, 150, 4, 58_500, 19_500, 6_000, 1_200, 4_725, 254, 338),
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
    assert work["episodes: directives (at least)"].requests == turns == contexts * 39
    assert work["episodes: replies"].requests == turns
    assert work["episodes: user turns"].requests == users == contexts * 13
    assert work["group judge (gpt-4o)"].requests == judged == contexts * 4
    assert work["director GRPO rollouts: directives"].requests == 38_400 * 8
    assert work["director GRPO rollouts: replies"].requests == 38_400 * 9
    assert work["director GRPO rollouts: user turns"].requests == 38_400 * 3
    assert work["director GRPO rollouts: directives"].backend == "Qwen/Qwen3-8B (in-process)"
    assert work["director before/after rollouts: directives"].requests == compared * 8
    steps = {step.name: step for step in plan.training(config, counts)}
    assert (steps["persona_rm"].steps, steps["persona_rm"].upper_bound) == (persona_rm, True)
    assert (steps["speaker"].steps, steps["director"].steps) == (500, 300)
    assert steps["group_rm"].steps == group_rm and steps["sft"].steps == sft


def test_the_api_judges_cost_at_the_configs_list_price():
    config = _config("paper.yaml")
    work = plan.requests(config, plan.counts(config, 3), plan.GUESSED_RATES)
    # gpt-4o at $2.50 / $10 per million tokens; prompts at the guessed 1,200 (a reply) and 2,500 (a trajectory)
    # tokens, completions at max_new_tokens 768:
    #   Stage 1 judging   48,000 x (1,200 x 2.5 + 768 x 10) / 1e6 = 144 + 368.64
    #   before/after       1,200 x (1,200 x 2.5 + 768 x 10) / 1e6 = 3.6 + 9.216
    #   group judging      8,000 x (2,500 x 2.5 + 768 x 10) / 1e6 = 50 + 61.44
    assert plan.api_costs(work, config.plan.prices) == {"gpt-4o-2024-08-06": pytest.approx(636.896)}
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
    # the Director beside its group RM also holds an in-process, merged copy of its policy for later directives
    assert rows["director"].scorer_bytes == 4 * 596_050_944 + 2 * 8_190_735_360
    assert plan.model_shape("some/unknown-model") is None


def test_the_command_prints_its_tables_and_refuses_a_config_without_a_limit(tmp_path):
    result = runner.invoke(app, ["plan", "--config", str(REPO / "configs" / "paper.yaml")], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    for fragment in ("2,000 contexts (200 held out) x 3 personas", "at most 4,725", "637", "GPU-hours",
                     "guessed rates", "63.4", "Not counted: the evaluation"):
        assert fragment in result.output, fragment
    text = (REPO / "configs" / "paper.yaml").read_text()
    unlimited = tmp_path / "configs" / "unlimited.yaml"
    unlimited.parent.mkdir()
    unlimited.write_text(re.sub(r"(?m)^    limit: 2000\n", "", text).replace("rosters/", f"{REPO}/configs/rosters/"))
    result = runner.invoke(app, ["plan", "--config", str(unlimited)])
    assert result.exit_code == 2 and "data.corpus.limit is not set" in result.output, result.output
    assert "Traceback" not in result.output
    assert "--config" in runner.invoke(app, ["plan", "--help"]).output
