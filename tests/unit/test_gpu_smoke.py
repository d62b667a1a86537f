"""benchmarks/gpu_smoke.py on a machine without a GPU: one clear line and status 2, before it builds anything; and
the paper profile's Director row of `mascot plan` that its Director memory part compares against."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

REPO = Path(__file__).resolve().parents[2]


def run_without_a_gpu(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    cache, temporary = tmp_path / "cache", tmp_path / "tmp"
    cache.mkdir()
    temporary.mkdir()
    # The tiny tokenizer would land in MASCOT_CACHE_DIR and the model's folder in TMPDIR.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "MASCOT_CACHE_DIR": str(cache), "TMPDIR": str(temporary)}
    result = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", *flags], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    return result, cache, temporary


@pytest.mark.parametrize("flags", [(), ("--no-colocate", "--colocate-memory", "0.2", "--no-director-memory",
                                         "--director-prompt-tokens", "512", "--paper-config", "configs/paper.yaml")])
def test_without_a_gpu_it_says_what_it_needs_and_exits_2_before_building_anything(tmp_path, flags):
    result, cache, temporary = run_without_a_gpu(tmp_path, *flags)

    assert result.returncode == 2, result.stdout + result.stderr
    [line] = [line for line in result.stderr.splitlines() if "needs a CUDA GPU" in line]
    assert "Qwen3-8B" in line and "GRPO" in line and "vLLM" in line
    assert "colocated vLLM" in line and "Director step's peak memory" in line and "mascot plan" in line
    assert list(cache.iterdir()) == [] and list(temporary.iterdir()) == [], "it built something before the GPU check"


def test_the_director_memory_part_compares_with_the_paper_profiles_director_row_of_mascot_plan():
    gpu_smoke = load_benchmark("gpu_smoke")

    policy, row = gpu_smoke.planned_director(REPO / "configs" / "paper.yaml", 80e9)

    # The paper's shapes: 8 completions a device step, 128 tokens each, in a 4096-token engine window.
    assert (policy.batch_size, policy.max_completion_length, policy.vllm_max_model_length) == (8, 128, 4096)
    assert row.name == "director"
    assert row.frozen_bytes == 2 * 8_190_735_360  # Qwen3-8B's parameters in bf16
    assert row.engine_bytes == int(policy.vllm_gpu_memory_utilization * 80e9)
