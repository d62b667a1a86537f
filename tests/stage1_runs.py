"""Helpers for tests that run `mascot run stage1` as a user would: a real process per run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MASCOT = str(Path(sys.executable).parent / "mascot")
# Tests pin the tiny models' warm start (today the demo's too), so that a longer one for the demo
# does not slow them down. conftest's `tiny_models` builds them once per session with these steps,
# and every config written here names the same build.
TEST_WARM_START = 600


def write_config(folder: Path, name: str = "stage1", cache_dir: Path | None = None, train: dict | None = None,
                 **stage1) -> Path:
    """configs/tiny.yaml, made test-sized (4 contexts, K=4, the session's tiny models), writing runs under
    `folder`; `stage1` and `train` entries override sections."""
    config = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    if cache_dir is not None:
        config["cache"] = {"dir": str(cache_dir)}
    config["run"]["output_dir"] = str(folder / "runs")
    config["data"]["roster"] = str(REPO / "configs" / "rosters" / "emotional_support.yaml")
    config["data"]["users"] = str(REPO / "configs" / "users" / "big_five.yaml")
    config["data"]["corpus"]["limit"] = 4
    config["stage1"]["rubric"] = str(REPO / "configs" / "rubrics" / "emotional_support.yaml")
    config["stage2"]["rubric"] = str(REPO / "configs" / "rubrics" / "group_emotional_support.yaml")
    config["eval"]["assistant"] = str(REPO / "configs" / "rosters" / "assistant_emotional_support.yaml")
    config["eval"]["neutral_rubric"] = str(REPO / "configs" / "rubrics" / "outcome_emotional_support.yaml")
    config["stage1"]["shard_size"] = 2
    config["stage1"]["k"] = 4
    config["tiny"]["warm_start_steps"] = TEST_WARM_START
    config["stage1"].update(stage1)
    for section, values in (train or {}).items():
        config["train"][section] = {**config["train"].get(section, {}), **values} if isinstance(values, dict) else values
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def mascot_run(config: Path, run_name: str, until: str = "pairs", **popen) -> subprocess.Popen:
    return subprocess.Popen([MASCOT, "run", "stage1", "--config", str(config), "--run-name", run_name,
                             "--until", until], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **popen)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output[-5000:]
    return output
