"""The GPU map: which of a machine's GPUs train and which serve.

A run shares its machine between the training steps (the flow's process, or the processes of an
`accelerate launch`) and the vLLM servers its backends name. Each GPU does one of the two: a trainer that
spreads over a server's GPU, or two servers on one GPU, run out of memory hours into a run. The map is
checked here for overlaps, and by `mascot config validate` against the GPUs this machine has
(`mascot.config.loading.machine_problems`). deployments/README.md gives the map and the server lines
for one H100, one H200 and one 8xH100 node.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, model_validator

from mascot.config.base import Section
from mascot.yamlio import FieldError

GpuIndex = Annotated[int, Field(ge=0)]
ServerName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+$")]


class GpuMap(Section):
    """GPU indices as `nvidia-smi` numbers them (the machine's, before any CUDA_VISIBLE_DEVICES)."""

    train: list[GpuIndex] = Field(min_length=1, description="GPUs of the training steps: the flow runs with "
                                  "CUDA_VISIBLE_DEVICES set to these; more than one needs each trainer's "
                                  "accelerate_config.")
    serve: dict[ServerName, list[GpuIndex]] = Field(
        default_factory=dict, description="GPUs of each vLLM server, by a name of your choice (qwen: [1], gemma: "
        "[2, 3]); its CUDA_VISIBLE_DEVICES, and --tensor-parallel-size their number. A server may share the training "
        "GPU only in the one-GPU layout, with --gpu-memory-utilization leaving the trainer its share: list it under "
        "shared instead.")
    shared: dict[ServerName, list[GpuIndex]] = Field(
        default_factory=dict, description="Servers that share a GPU with training on purpose (a one-GPU machine), "
        "each started with a --gpu-memory-utilization that leaves the trainer room.")

    @model_validator(mode="after")
    def _each_gpu_has_one_job(self) -> GpuMap:
        _no_repeats(("train",), self.train)
        owner = {gpu: "train" for gpu in self.train}
        for name, gpus in self.serve.items():
            _no_repeats(("serve", name), gpus)
            for index, gpu in enumerate(gpus):
                if gpu in owner:
                    raise FieldError(("serve", name, index), f"GPU {gpu} is already given to {owner[gpu]}; each GPU "
                                     "trains or serves one server, never both (a server sharing the training GPU on a "
                                     "one-GPU machine goes under gpus.shared, with a --gpu-memory-utilization that "
                                     "leaves the trainer its share)")
                owner[gpu] = f"serve.{name}"
        for name, gpus in self.shared.items():
            _no_repeats(("shared", name), gpus)
            if name in self.serve:
                raise FieldError(("shared", name), f"server '{name}' is listed under both serve and shared")
        return self

    def indices(self) -> dict[tuple, int]:
        """Every GPU index of the map, by its YAML path below `gpus`."""
        found = {("train", i): gpu for i, gpu in enumerate(self.train)}
        for group in ("serve", "shared"):
            for name, gpus in getattr(self, group).items():
                found |= {(group, name, i): gpu for i, gpu in enumerate(gpus)}
        return found

    @property
    def training_visible_devices(self) -> str:
        """CUDA_VISIBLE_DEVICES for the flow's process: the training GPUs."""
        return ",".join(map(str, self.train))


def _no_repeats(loc: tuple, gpus: list[int]) -> None:
    for index, gpu in enumerate(gpus):
        if gpu in gpus[:index]:
            raise FieldError((*loc, index), f"GPU {gpu} is listed twice")
