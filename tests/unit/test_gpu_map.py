"""The GPU map (`gpus:`): checked for overlaps in the config and against this machine's GPUs; a training step
that would see several GPUs outside `accelerate launch` stops before it starts; every device is the process's own
GPU by index, in every thread.

The machine's GPU count is faked through the function the checks call (`visible_gpu_count`), since this machine
has none."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from mascot import torch_runtime
from mascot.config import load_config, loading
from mascot.train import launch
from mascot.train.runtime import TrainingSetupError, device_args, trainer_device

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
EIGHT_H100 = {"train": [0, 1, 2, 3], "serve": {"qwen": [4, 5], "gemma": [6], "phi": [7]}}


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path / "configs"


def _with(configs: Path, gpus: dict, **trainer_changes) -> Path:
    data = yaml.safe_load((configs / "tiny.yaml").read_text())
    data["gpus"] = gpus
    for trainer, changes in trainer_changes.items():
        data["train"][trainer].update(changes)
    path = configs / "gpus.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _validate(path: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["config", "validate", str(path), *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def _located(output: str, yaml_path: str) -> bool:
    return re.search(rf"gpus\.yaml:\d+: {re.escape(yaml_path)}: ", output) is not None


def _fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(loading, "visible_gpu_count", lambda: count)


def test_a_gpu_that_trains_and_serves_is_an_error_at_its_yaml_path(configs):
    path = _with(configs, {"train": [0, 1], "serve": {"qwen": [2], "gemma": [1]}})
    code, output = _validate(path, "--no-machine-checks")
    assert code == 2, output
    assert _located(output, "gpus.serve.gemma[0]"), output
    assert "GPU 1 is already given to train" in output and "gpus.shared" in output


def test_two_servers_on_one_gpu_and_a_repeated_gpu_are_errors(configs):
    code, output = _validate(_with(configs, {"train": [0], "serve": {"qwen": [1], "phi": [1]}}), "--no-machine-checks")
    assert code == 2 and _located(output, "gpus.serve.phi[0]") and "already given to serve.qwen" in output, output
    code, output = _validate(_with(configs, {"train": [0, 0]}), "--no-machine-checks")
    assert code == 2 and _located(output, "gpus.train[1]") and "listed twice" in output, output


def test_the_map_is_checked_against_the_gpus_of_the_machine(configs, monkeypatch):
    path = _with(configs, EIGHT_H100)
    _fake_gpus(monkeypatch, 8)
    code, output = _validate(path)
    assert code == 0, output
    _fake_gpus(monkeypatch, 6)  # the 8xH100 map on a 6-GPU machine: GPUs 6 and 7 are missing
    code, output = _validate(path)
    assert code == 2, output
    assert _located(output, "gpus.serve.gemma[0]") and _located(output, "gpus.serve.phi[0]"), output
    assert "GPU 6 does not exist here: this machine shows 6 GPU(s) (0 to 5)" in output
    assert not _located(output, "gpus.serve.qwen[1]"), output
    _fake_gpus(monkeypatch, 0)
    code, output = _validate(path)
    assert code == 2 and "no CUDA GPU" in output and "--no-machine-checks" in output, output
    assert _validate(path, "--no-machine-checks")[0] == 0


def test_several_training_gpus_need_each_gpu_trainer_launched(configs):
    path = _with(configs, {"train": [0, 1], "serve": {"qwen": [2]}}, speaker={"use_cpu": False})
    code, output = _validate(path, "--no-machine-checks")
    assert code == 2, output
    assert _located(output, "train.speaker"), output
    assert "accelerate_config: ../deployments/accelerate/multi_gpu.yaml" in output
    launched = _with(configs, {"train": [0, 1]}, speaker={"use_cpu": False,
                                                           "accelerate_config": "../deployments/accelerate/multi_gpu.yaml"})
    (configs.parent / "deployments" / "accelerate").mkdir(parents=True)
    shutil.copy(REPO / "deployments" / "accelerate" / "multi_gpu.yaml", configs.parent / "deployments" / "accelerate")
    assert load_config(launched).gpus.train == [0, 1]


def test_a_training_step_that_sees_several_gpus_outside_a_launch_stops_before_it_starts(monkeypatch, tiny_config):
    speaker = tiny_config.train.speaker.model_copy(update={"use_cpu": False})
    calls = []

    def train_speaker():
        calls.append(1)
        return "trained"

    monkeypatch.setattr(launch, "visible_gpu_count", lambda: 8)
    with pytest.raises(TrainingSetupError) as refused:
        launch.launched(speaker, train_speaker)
    assert not calls
    message = str(refused.value)
    assert "train_speaker" in message and "sees 8 GPUs" in message
    assert "accelerate_config: ../deployments/accelerate/multi_gpu.yaml" in message and "CUDA_VISIBLE_DEVICES" in message
    # one GPU, or a trainer on the CPU, trains in the flow's process as before
    assert launch.launched(speaker.model_copy(update={"use_cpu": True}), train_speaker) == "trained"
    monkeypatch.setattr(launch, "visible_gpu_count", lambda: 1)
    assert launch.launched(speaker, train_speaker) == "trained" and len(calls) == 2


def test_every_device_is_the_process_gpu_by_index_in_every_thread(monkeypatch, tiny_config):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as a GPU machine answers
    monkeypatch.setenv("LOCAL_RANK", "3")  # the fourth process of an accelerate launch
    speaker = tiny_config.train.speaker.model_copy(update={"use_cpu": False})
    seen = {}

    def in_a_thread():  # a snapshot model or a scorer loaded off the main thread
        seen["thread"] = (trainer_device(speaker), torch_runtime.resolve_device("auto"))

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert seen["thread"] == ("cuda:3", "cuda:3")
    assert trainer_device(speaker) == "cuda:3" and device_args(speaker)["use_cpu"] is False
    monkeypatch.delenv("LOCAL_RANK")
    assert trainer_device(speaker) == "cuda:0"
    assert trainer_device(tiny_config.train.speaker) == "cpu"  # use_cpu: true
