"""Stage 1 training on the tiny models: real TRL RewardTrainer and GRPOTrainer, real PEFT.

The first test calls the library as a notebook would and loads every artifact back the way a user
would. The second runs `mascot run stage1` to the end, SIGKILLs it once the Speaker has saved a
checkpoint, and checks that the rerun resumes from that checkpoint's step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
from stage1_runs import MASCOT, finish, mascot_run, write_config

from mascot import tracking
from mascot.artifacts import Artifact, path_sha256
from mascot.config import load_config
from mascot.data.contexts import held_out_ids
from mascot.judges.panel import PanelSpec
from mascot.queries import Queries, context_ids
from mascot.roster import load_roster
from mascot.stage1.before_after import compare_policies, sample_policies, score_replies
from mascot.stage1.judging import judge_shard
from mascot.stage1.speaker import train_speaker
from mascot.train.reward_model import train_reward_model
from mascot.train.runtime import Resume
from mascot.train.tiny import resolve_tiny_models

pytestmark = pytest.mark.integration

TRAIN = {"persona_rm": {"epochs": 1, "save_steps": 2, "accuracy_sample_pairs": 20}, "speaker": {"max_steps": 3, "save_steps": 1},
         "before_after": {"samples_per_prompt": 2, "bootstrap_resamples": 500}}
SCORES = {"reward", "persona_rm", "format", "conciseness", "judge"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_models):
    return tmp_path_factory.mktemp("training")


@pytest.fixture(scope="module")
def pairs_run(workdir):
    config = write_config(workdir, "pairs", train=TRAIN)
    finish(mascot_run(config, "library", until="pairs"))
    return load_config(config), workdir / "runs" / "library"


def artifact(path: Path) -> Artifact:
    return Artifact(path=path, sha256=path_sha256(path))


def check_interval(share: dict, n: int) -> None:
    assert share["n"] == n and share["confidence"] == 0.95
    assert 0.0 <= share["ci_low"] <= share["value"] <= share["ci_high"] <= 1.0


def test_reward_model_speaker_and_comparison_load_back(pairs_run, tiny_models):
    import torch
    import wandb
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    config, run = pairs_run
    contexts, pairs = artifact(run / "stage1" / "contexts.parquet"), artifact(run / "stage1" / "pairs.parquet")
    roster = load_roster(config.data.roster)
    queries = Queries(contexts=contexts, roster=roster)

    with tracking.wandb_run(config, "library"):  # as the flow does: the trainers log into it
        wandb_dir = Path(tracking.active_run().dir)
        resolved = resolve_tiny_models(config)
        rm = train_reward_model(resolved.train.persona_rm, pairs, contexts, run / "stage1" / "persona_rm",
                                group_by="persona", name="persona_rm")
        speaker = train_speaker(resolved.train.speaker, queries, rm, run / "stage1" / "speaker")
    wandb.teardown()  # finish() may return before wandb's service has flushed the record log; this waits for it
    # Offline wandb keeps its records in one binary log, where metric names are plain bytes.
    record = next(wandb_dir.parent.glob("run-*.wandb")).read_bytes()
    assert b"train/persona_rm/loss" in record and b"train/speaker/rewards/persona_rm/mean" in record

    reward_model = AutoModelForSequenceClassification.from_pretrained(rm.path)
    tokenizer = AutoTokenizer.from_pretrained(rm.path)
    row = pairs.read_parquet().row(0, named=True)
    ids = tokenizer.apply_chat_template([*row["prompt"], {"role": "assistant", "content": row["chosen"]}],
                                        return_tensors="pt", return_dict=True)
    assert reward_model(**ids).logits.shape == (1, 1)
    metrics = json.loads((rm.path / "metrics.json").read_text())
    held = held_out_ids(contexts)
    frame = pairs.read_parquet()
    held_pairs = frame.filter(context_ids(frame["query_id"]).is_in(held))
    check_interval(metrics["held_out"]["accuracy"], held_pairs.height)
    assert held_pairs.height > 0, "the tiny run must leave pairs to evaluate on"
    for persona, share in metrics["held_out"]["by_persona"].items():
        check_interval(share, held_pairs.filter(pl.col("persona") == persona).height)
    assert metrics["held_out"]["margin"]["n"] == held_pairs.height
    assert metrics["training"]["train_pairs"] == frame.height - held_pairs.height
    sample = TRAIN["persona_rm"]["accuracy_sample_pairs"]
    assert metrics["train"]["pairs"] == metrics["training"]["train_pairs"] > sample, "the tiny run must sample"
    assert metrics["train"]["pairs_scored"] == metrics["train"]["accuracy"]["n"] == sample
    assert metrics["train"]["scores"]["n"] == 2 * sample, "the score scale is measured on the sample"
    assert not list((run / "stage1" / "checkpoints").glob("persona_rm-*")), "checkpoints go once the model is saved"

    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_models.lm), speaker.path)
    lora_b = {name: p for name, p in policy.named_parameters() if "lora_B" in name}
    # PEFT initialises lora_B to zero; non-zero weights mean GRPO's updates were saved.
    assert lora_b and any(torch.count_nonzero(p) for p in lora_b.values())
    adapter = json.loads((speaker.path / "adapter_config.json").read_text())
    lora = config.train.speaker.lora
    assert adapter["r"] == lora.r and set(adapter["target_modules"]) == set(lora.target_modules)
    speaker_metrics = json.loads((speaker.path / "metrics.json").read_text())
    lora_parameters = sum(p.numel() for name, p in policy.named_parameters() if "lora_" in name)
    assert speaker_metrics["trainable_parameters"]["trainable"] == lora_parameters
    assert speaker_metrics["training"]["steps"] == 3
    history = speaker_metrics["log_history"]
    assert [entry["step"] for entry in history] == [1, 2, 3]
    assert all(f"rewards/{name}/mean" in entry for entry in history for name in ("persona_rm", "format", "conciseness"))

    held_out, work, requests = queries.held_out(), run / "work", run / "requests.sqlite"
    compare = resolved.train.before_after
    samples = sample_policies(resolved.train.speaker, compare, held_out, speaker, requests, work / "samples.parquet")
    scored = score_replies(resolved.train.speaker, held_out, rm, samples, work / "scored.parquet")
    judged = judge_shard(PanelSpec.load(config.stage1.judges, config.stage1.rubric), config.run.seed, held_out,
                         samples, requests, work / "judgments.parquet")
    comparison = compare_policies(compare, config.run.seed, scored, judged, contexts,
                                  run / "stage1" / "speaker_eval")
    result = json.loads((comparison.path / "metrics.json").read_text())
    prompts = len(held) * len(roster.active)
    assert result["prompts"] == prompts and set(result["scores"]) == SCORES
    for score in result["scores"].values():
        difference = score["difference"]
        assert score["base"]["n"] == score["speaker"]["n"] == difference["n"] == prompts
        assert difference["ci_low"] <= difference["mean"] <= difference["ci_high"]
    samples = pl.read_parquet(comparison.path / "samples.parquet")
    assert samples.height == 2 * prompts * 2
    assert samples.group_by("policy").len().sort("policy")["len"].to_list() == [prompts * 2] * 2


def test_a_killed_speaker_training_resumes_from_its_checkpoint(workdir):
    config = write_config(workdir, "resume", train={**TRAIN, "speaker": {"max_steps": 8, "save_steps": 1}})
    run = workdir / "runs" / "resume"
    checkpoints = run / "stage1" / "steps" / "checkpoints"
    process = mascot_run(config, "resume", until="speaker", start_new_session=True)
    deadline = time.monotonic() + 600
    while not any(checkpoints.glob("speaker-*/checkpoint-*/trainer_state.json")):
        assert process.poll() is None, process.communicate()[0][-5000:]
        assert time.monotonic() < deadline, "the Speaker saved no checkpoint"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = Resume.latest(next(checkpoints.glob("speaker-*")))
    assert 1 <= killed_at.step < 8 and not (run / "stage1" / "speaker").exists(), "the kill came too late"

    # Resumed as a user would after a crash; the optimizer steps it runs are counted from outside.
    steps_run = workdir / "resume-steps.log"
    # Before the caller's own path, not instead of it: a worktree run with PYTHONPATH=. resumes its own code.
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent / "step_counter"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "MASCOT_TEST_STEP_LOG": str(steps_run)}
    output = finish(subprocess.Popen([MASCOT, "resume", str(run)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env))
    assert steps_run.read_text().split() == [str(step) for step in range(killed_at.step + 1, 9)], \
        "training went on from the checkpoint's step, not from the start"
    reward_model_runs = [line for line in output.splitlines() if "Task run 'train_persona_rm-" in line]
    assert reward_model_runs and all("Cached" in line for line in reward_model_runs), "the reward model is reused"
    training = json.loads((run / "stage1" / "speaker" / "metrics.json").read_text())
    assert training["training"]["resumed_from_step"] == killed_at.step
    assert training["training"]["steps"] == 8 and training["training"]["steps_run"] == 8 - killed_at.step
    assert [entry["step"] for entry in training["log_history"]] == list(range(1, 9))
    assert not checkpoints.exists() or not any(checkpoints.iterdir()), "checkpoints are dropped after success"

    summary = json.loads((run / "stage1" / "summary.json").read_text())
    assert summary["persona_rm"]["held_out"]["accuracy"]["n"] > 0
    assert summary["speaker"]["training"]["resumed_from_step"] == killed_at.step
    for score in summary["before_after"]["scores"].values():
        assert {"mean", "n", "ci_low", "ci_high"} <= set(score["difference"])
    report = (run / "stage1" / "report.md").read_text()
    assert "Held-out pair accuracy" in report and "difference [95% CI over clusters]" in report
    assert (run / "stage1" / "reward_curve.png").read_bytes().startswith(b"\x89PNG")
    manifest = json.loads((run / "manifest.json").read_text())["artifacts"]
    assert {"stage1/persona_rm", "stage1/speaker", "stage1/speaker_eval", "stage1/report"} <= set(manifest)

    # One offline wandb run per flow run. The killed one may not have flushed; the rerun's holds the
    # Speaker's training logs and the summary (metric names are plain bytes in the record log).
    records = [path.read_bytes() for path in (run / "wandb").glob("offline-run-*/run-*.wandb")]
    assert len(records) == 2
    assert any(b"train/speaker/reward" in data and b"stage1/before_after/persona_rm_difference" in data
               for data in records)
    assert "stage 1 done" in output and str(run / "stage1" / "report.md") in output

    # The runs' Prefect artifacts, read back from the same PREFECT_HOME through the Prefect API.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        published = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="resume-stage1-")))
    kinds = {artifact.key: artifact.type for artifact in published}
    assert kinds["resume-stage1-persona-rm-accuracy"] == kinds["resume-stage1-before-after"] == "table"
    assert kinds["resume-stage1-reward-curve"] == "image" and kinds["resume-stage1-summary"] == "markdown"

    # A partial rerun of the finished run (the deployment example's `--until pairs`) reports beside the
    # finished report, says what it describes and links it; the run's report still shows the trained Speaker.
    finish(mascot_run(config, "resume", until="pairs"))
    assert (run / "stage1" / "report.md").read_text() == report
    assert "before_after" in json.loads((run / "stage1" / "summary.json").read_text())
    partial = run / "stage1" / "partial" / "until-pairs" / "report.md"
    assert "A partial run, `--until pairs`" in partial.read_text() and "(../../report.md)" in partial.read_text()
    assert (partial.parent / "../../report.md").resolve() == (run / "stage1" / "report.md").resolve()


def test_no_pairs_to_train_on_is_a_clear_error_without_a_retry(workdir):
    # No gap reaches 10 sd of z-scored scores (on the 1-5 scale, config validation refuses a margin of 10).
    config = write_config(workdir, "no-pairs", train=TRAIN, margin=10.0, aggregation="zscore")
    process = mascot_run(config, "no-pairs", until="persona_rm")
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 1, output[-3000:]
    assert "stage 1 stopped" in output and "no pairs outside the held-out contexts" in output
    assert "stage1.margin" in output and "Retry 1/1 will start" not in output  # Prefect's retry log line


def test_pairs_all_longer_than_max_length_are_a_clear_error_without_a_retry(workdir):
    # 32 tokens hold no speaker prompt: RewardTrainer would drop every pair and then fail on an empty dataset.
    config = write_config(workdir, "too-long", train={**TRAIN, "persona_rm": {**TRAIN["persona_rm"], "max_length": 32}})
    process = mascot_run(config, "too-long", until="persona_rm")
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 1, output[-3000:]
    assert "stage 1 stopped" in output and "is longer than 32 tokens" in output
    assert "raise train.persona_rm.max_length" in output and "Retry 1/1 will start" not in output


def test_a_training_task_that_fails_is_retried_from_its_checkpoint(workdir):
    """The reward model's training crashes at step 3; Prefect retries the task, which resumes there."""
    config = write_config(workdir, "retried", train={**TRAIN, "persona_rm": {"epochs": 2, "save_steps": 1}})
    steps_run = workdir / "retried-steps.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent / "step_counter"),
           "MASCOT_TEST_STEP_LOG": str(steps_run), "MASCOT_TEST_FAIL_AT_STEP": "3"}
    output = finish(mascot_run(config, "retried", until="persona_rm", env=env))
    steps = [int(step) for step in steps_run.read_text().split()]
    # The first attempt ran steps 1-3 and died before saving step 3; the retry went on from checkpoint 2.
    assert steps[:4] == [1, 2, 3, 3] and steps[3:] == list(range(3, steps[-1] + 1)) and steps[-1] > 3, steps
    attempts = [line for line in output.splitlines() if "Task run 'train_persona_rm-" in line]
    assert "injected failure at step 3" in attempts[0] and "Finished in state Completed" in attempts[-1], attempts
    metrics = json.loads((workdir / "runs" / "retried" / "stage1" / "persona_rm" / "metrics.json").read_text())
    assert metrics["held_out"]["accuracy"]["n"] > 0
