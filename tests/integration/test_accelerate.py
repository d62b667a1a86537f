"""Training steps over several processes: `accelerate launch` with the config file the project ships
(deployments/accelerate/multi_gpu.yaml), run by the Stage 1 flow.

Without a GPU, the processes train on the CPU over gloo (the tiny profile's trainers have use_cpu), which is
the same data-parallel path as on GPUs: each process trains on its share of every batch, and gradients are
averaged. Which processes ran which steps is read from the training processes themselves (the step counter).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

import launch_probe
import pytest
from stage1_runs import REPO, finish, mascot_run, write_config

from mascot.train.launch import LaunchError, launched

pytestmark = pytest.mark.integration

MULTI_GPU = str(REPO / "deployments" / "accelerate" / "multi_gpu.yaml")
STEP_COUNTER = Path(__file__).parent / "step_counter"


def test_stage1_trains_its_reward_model_and_speaker_in_two_processes(tmp_path, tiny_models):
    train = {"persona_rm": {"epochs": 1, "batch_size": 4, "accelerate_config": MULTI_GPU},
             "speaker": {"max_steps": 2, "save_steps": 1, "accelerate_config": MULTI_GPU}}
    config = write_config(tmp_path, "ddp", train=train)
    log = tmp_path / "steps.log"
    env = {**os.environ, "PYTHONPATH": str(STEP_COUNTER), "MASCOT_TEST_STEP_LOG": str(log)}
    output = finish(mascot_run(config, "ddp", until="speaker", env=env))

    steps = defaultdict(lambda: defaultdict(list))  # trainer -> (pid, index, world size) -> steps
    for line in Path(f"{log}.processes").read_text().splitlines():
        pid, index, world, trainer, step = line.split()
        steps[trainer][(int(pid), int(index), int(world))].append(int(step))
    assert set(steps) == {"RewardConfig", "GRPOConfig"}, output[-3000:]
    for trainer, processes in steps.items():
        assert sorted((index, world) for _, index, world in processes) == [(0, 2), (1, 2)], trainer
        assert len({pid for pid, _, _ in processes}) == 2 and os.getpid() not in processes
        assert len({tuple(run) for run in processes.values()}) == 1, "both processes ran every step together"

    run = tmp_path / "runs" / "ddp" / "stage1"
    rm = json.loads((run / "persona_rm" / "metrics.json").read_text())
    pairs = rm["training"]["train_pairs_within_max_length"]
    # Each process takes 4 pairs a step, so an epoch is half the steps of one process's.
    assert rm["training"]["steps"] == math.ceil(pairs / 8) < math.ceil(pairs / 4)
    for run_steps in steps["RewardConfig"].values():
        assert run_steps == list(range(1, rm["training"]["steps"] + 1))
    assert rm["held_out"]["accuracy"]["n"] > 0  # the first process scored the trained model afterwards

    speaker = json.loads((run / "speaker" / "metrics.json").read_text())
    assert speaker["training"]["steps"] == 2 and [entry["step"] for entry in speaker["log_history"]] == [1, 2]
    assert (run / "speaker" / "adapter_model.safetensors").exists()


def test_a_launch_makes_the_call_in_each_process_and_returns_the_first_ones_result(tmp_path, tiny_config, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(launch_probe.__file__).parent))
    trainer = tiny_config.train.speaker.model_copy(update={"accelerate_config": Path(MULTI_GPU)})
    log = tmp_path / "where.log"
    assert launched(trainer, launch_probe.where, log) == "0"
    processes = [line.split() for line in log.read_text().splitlines()]
    assert sorted(rank for _, rank, _ in processes) == ["0", "1"] and len({pid for pid, _, _ in processes}) == 2
    limits = {folder for _, _, folder in processes}
    assert len(limits) == 1, "the processes of a launch share one limits folder"

    with pytest.raises(LaunchError, match=r"fail under `accelerate launch --config_file .*multi_gpu.yaml` exited "
                                          r"with status 1.*remove accelerate_config"):
        launched(trainer, launch_probe.fail)
