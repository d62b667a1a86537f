"""benchmarks/gpu_smoke.py on a machine without a GPU: one clear line and status 2, before it builds anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_without_a_gpu_it_says_what_it_needs_and_exits_2_before_building_anything(tmp_path):
    cache, temporary = tmp_path / "cache", tmp_path / "tmp"
    cache.mkdir()
    temporary.mkdir()
    # The tiny tokenizer would land in MASCOT_CACHE_DIR and the model's folder in TMPDIR.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "MASCOT_CACHE_DIR": str(cache), "TMPDIR": str(temporary)}
    result = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, check=False)

    assert result.returncode == 2, result.stdout + result.stderr
    [line] = [line for line in result.stderr.splitlines() if "needs a CUDA GPU" in line]
    assert "Qwen3-8B" in line and "GRPO" in line and "vLLM" in line
    assert list(cache.iterdir()) == [] and list(temporary.iterdir()) == [], "it built something before the GPU check"
