"""torch and transformers, imported only when used: the checks and settings every model-running part shares.

The core install has no torch (it comes with the `train` extra), so nothing here imports it at
module level; the LLM backends, the trainers and the reward functions call these helpers instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


class MissingTrainExtra(ImportError):
    """Running models in this process needs torch and peft, which come with the `train` extra."""

    def __init__(self, missing: str):
        super().__init__(
            f"running models in this process needs '{missing}', which is not installed; "
            "install it with: pip install 'mascot[train]'"
        )


def require_torch():
    try:
        import torch
    except ImportError as exc:
        raise MissingTrainExtra("torch") from exc
    return torch


def resolve_device(device: str) -> str:
    """'auto' becomes this process's GPU (`cuda_device`) when one is visible, else 'cpu'; other names pass through."""
    if device != "auto":
        return device
    return cuda_device() if require_torch().cuda.is_available() else "cpu"


def cuda_device() -> str:
    """This process's GPU, by index: `cuda:{LOCAL_RANK}` under `accelerate launch` (torchrun numbers the processes
    of a machine), else `cuda:0`. Never a bare 'cuda', which means the calling thread's current device: a model
    loaded in a worker thread would land on GPU 0 in every process of a launch, since only the main thread's current
    device is set by the launcher."""
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def inference_dtype(device: str, *, bf16_capable: bool | None = None) -> str:
    """The precision a model is only run in (scored, not trained) on `device`: bfloat16 on a CUDA GPU with native
    bf16 (Ampere and later), else float32. bf16 halves the weights' memory and runs the matmuls about twice as fast
    there; a score keeps about 3 significant digits, which a pair's ranking and a scale estimate do not feel. The CPU
    stays in float32: most CPUs have no bf16 arithmetic, so torch emulates it, slower than float32. So does an older
    GPU (V100, T4), which is why emulation does not count. `bf16_capable` is asked of the GPU when left out; a test
    passes it to decide for a GPU it does not have."""
    if not device.startswith("cuda"):
        return "float32"
    if bf16_capable is None:
        torch = require_torch()
        with torch.cuda.device(device):
            bf16_capable = torch.cuda.is_bf16_supported(including_emulation=False)
    return "bfloat16" if bf16_capable else "float32"


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide transformers' load reports and progress bars; mascot reports its own progress."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
