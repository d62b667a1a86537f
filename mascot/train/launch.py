"""One training step over several processes, one per GPU: TRL's trainer under `accelerate launch`; or in another
environment's Python.

A trainer whose config names an `accelerate_config` does not train in the flow's process. `launched` writes the
call (the training function and its arguments, all plain data) to a folder, runs
`accelerate launch --config_file <file> -m mascot.train.launch <folder>`, and waits. Every process it starts
makes the same call: the trainer wraps the model in DistributedDataParallel and each process trains on its
share of every batch, so a step's batch is `batch_size` times the processes. The first process alone writes the
outputs (the trainers return None in the others) and hands its result back through the folder.

A trainer whose config names a `python` trains in a process of that interpreter, the same way (with one process,
or under its `accelerate launch`): the environment TRL's `use_vllm` needs has vLLM, which cannot install beside the
flows' prefect (deployments/README.md). The process imports this checkout's `mascot`; its environment supplies
the rest (torch, TRL, PEFT, vLLM).

The processes of one launch share the backends' limits like the workers of a Dask flow run
(`mascot.llm.limits`): the Director's rollouts of every process together keep within `max_concurrency`.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mascot.artifacts import Artifact
from mascot.config import TrainerConfig
from mascot.config.loading import visible_gpu_count
from mascot.llm.limits import LIMITS_DIR
from mascot.train.runtime import TrainingSetupError

CALL, RESULT = "call.pickle", "result.pickle"


class LaunchError(RuntimeError):
    """`accelerate launch` of a training step failed; its processes' output is above."""


def launched(config: TrainerConfig, train: Callable[..., Any], *args: Any, **kwargs: Any) -> Artifact:
    """`train(*args, **kwargs)`, in this process, or in the processes of `config.accelerate_config` if it names one,
    or in a process of `config.python`'s environment if it names one."""
    if config.accelerate_config is None:
        refuse_several_gpus(config, train.__name__)
        if config.python is None:
            from mascot.llm.transformers_backend import models_released

            with models_released():  # the scorers and policy snapshots it loaded leave with it
                return train(*args, **kwargs)  # a trainer returns None only in the later processes of a launch
    python = str(config.python or sys.executable)
    with tempfile.TemporaryDirectory(prefix="mascot-launch-") as folder:
        (Path(folder) / CALL).write_bytes(pickle.dumps((train, args, kwargs)))
        launcher, where = [], [f"in {config.python}"] if config.python else []
        if config.accelerate_config is not None:
            launcher = ["-m", "accelerate.commands.launch", "--config_file", str(config.accelerate_config),
                        "--main_process_port", str(free_port())]
            where.insert(0, f"under `accelerate launch --config_file {config.accelerate_config}`")
        finished = subprocess.run([python, *launcher, "-m", __name__, folder],
                                  env=launch_environment(config, Path(folder)), check=False)
        if finished.returncode != 0:
            raise LaunchError(f"{train.__name__} {' '.join(where)} exited with status {finished.returncode}; the output of its "
                              "processes is above. To train in the flow's process instead, remove accelerate_config "
                              "and python from the trainer's section")
        return pickle.loads((Path(folder) / RESULT).read_bytes())


def launch_environment(config: TrainerConfig, folder: Path) -> dict[str, str]:
    """The launched processes' environment: this one, a limits folder, and, for another environment's Python, this
    checkout's `mascot` package first on its path. Only the package is linked there (`folder`/path/mascot): the
    folder above it may be this environment's site-packages, whose torch must not shadow the other one's."""
    # A flow run on Dask or Ray has a limits folder already; otherwise this launch's processes get one of their own.
    environment = {LIMITS_DIR: str(folder / "limits"), **os.environ}
    if config.python is not None:
        (folder / "path").mkdir()
        (folder / "path" / "mascot").symlink_to(Path(__file__).resolve().parents[1], target_is_directory=True)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder / "path"), os.environ.get("PYTHONPATH")]))
    return environment


def refuse_several_gpus(config: TrainerConfig, step: str, gpu_count: Callable[[], int] | None = None) -> None:
    """A step in the flow's process that sees several GPUs would train on one and leave the rest idle, or, with
    TRL's GRPOTrainer, stop at nn.DataParallel, after the steps before it have run; so it stops before it starts."""
    if config.use_cpu or (count := (gpu_count or visible_gpu_count)()) <= 1:
        return
    raise TrainingSetupError(
        f"{step} would train in the flow's process, which sees {count} GPUs (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); give the trainer's section accelerate_config: "
        "../deployments/accelerate/multi_gpu.yaml (num_processes = its GPUs) to train on all of them, or run the flow "
        "with CUDA_VISIBLE_DEVICES set to the one training GPU of the config's gpus.train")


def free_port() -> int:
    """A port for the processes to meet on: accelerate's default, 29500, would refuse a second launch at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(folder: Path) -> None:
    """One process of a launch: make the call; the first process hands its result back."""
    train, args, kwargs = pickle.loads((folder / CALL).read_bytes())
    result = train(*args, **kwargs)
    if os.environ.get("RANK", "0") == "0":  # torchrun numbers the processes it starts
        (folder / RESULT).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
