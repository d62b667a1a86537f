"""deployments/vllm-requirements.txt, the vLLM environment of a GPU machine: one vLLM release, on the project's torch
and transformers, and pip resolves it from PyPI (a dry run into an empty target: nothing is installed anywhere).

vLLM pins torch exactly in every release, so a release built on another torch than the project's would train and
serve on two different builds, and a looser spec would let pip pick one. The resolution needs PyPI: where PyPI does
not answer, that test is skipped and says so; a resolution that fails is a failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO / "deployments" / "vllm-requirements.txt"


def file_requirements() -> dict[str, Requirement]:
    lines = [line.strip() for line in REQUIREMENTS.read_text().splitlines()]
    return {(r := Requirement(line)).name: r for line in lines if line and not line.startswith("#")}


def project_requirements() -> dict[str, Requirement]:
    """The project's dependencies and its `train` and `wandb` extras', as pyproject.toml states them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs = [*project["dependencies"], *extras["train"], *extras["wandb"]]
    return {(r := Requirement(spec)).name: r for spec in specs}


def pypi_answers() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/vllm/", timeout=10):
            return True
    except OSError:
        return False


def test_the_vllm_environment_pins_one_release_on_the_projects_torch_and_transformers():
    pinned, project = file_requirements(), project_requirements()
    assert str(pinned["vllm"].specifier).startswith("=="), f"vllm is not pinned to one release: {pinned['vllm']}"
    for name in ("torch", "transformers", "trl"):
        assert pinned[name].specifier == project[name].specifier, (
            f"{REQUIREMENTS.name} has {pinned[name]}, the project {project[name]}")


def test_the_vllm_environment_can_train_a_step_that_imports_vllm():
    """It is also the environment a trainer's `python:` names for use_vllm: everything the training step imports,
    at the project's versions, and no prefect (whose fastapi range excludes vLLM's)."""
    pinned, project = file_requirements(), project_requirements()
    missing = sorted(set(project) - set(pinned) - {"prefect"})
    assert not missing, f"{REQUIREMENTS.name} lacks what a training step needs: {missing}"
    assert "prefect" not in pinned
    for name in set(project) & set(pinned) - {"trl"}:  # trl is pinned with its vllm extra
        assert pinned[name].specifier == project[name].specifier, (
            f"{REQUIREMENTS.name} has {pinned[name]}, the project {project[name]}")


def test_the_vllm_environment_resolves_from_pypi_and_keeps_the_projects_torch(tmp_path):
    if not pypi_answers():
        pytest.skip("PyPI does not answer from this machine, so the vLLM environment's resolution cannot be checked")
    pinned = file_requirements()
    report, target = tmp_path / "report.json", tmp_path / "site"
    # --dry-run: resolve and report, install nothing; --target: an empty place, never the running environment.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
         "--target", str(target), "-r", str(REQUIREMENTS)],
        capture_output=True, text=True, timeout=300, check=False,
    )

    assert result.returncode == 0, f"pip could not resolve {REQUIREMENTS.name}:\n{result.stderr[-3000:]}"
    resolved = {item["metadata"]["name"].lower(): Version(item["metadata"]["version"])
                for item in json.loads(report.read_text())["install"]}
    assert resolved["vllm"] in pinned["vllm"].specifier, resolved["vllm"]
    # A local build of the same release (2.13.0+cpu from a machine's wheel folder) is the same torch.
    assert Version(resolved["torch"].public) in pinned["torch"].specifier, f"torch became {resolved['torch']}"
    assert resolved["transformers"] in pinned["transformers"].specifier, resolved["transformers"]
    assert not target.exists() or not any(target.iterdir()), "a dry run installed something"
