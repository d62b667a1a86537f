"""Test-session setup: every cache and home directory lives under one temporary folder.

The variables are set at import time, before transformers, prefect or wandb read them.

The suite runs on two pytest-xdist workers (pyproject's addopts): most integration tests wait on servers and
subprocesses, and use about one of CI's two cores. The controller imports this file first and the workers inherit its
folder. Each worker has caches and homes of its own, as a serial run has, but the tiny models are built once for all
of them: every worker's cache links its `tiny-models` to one folder, and `tiny_models` builds there under a lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SESSION_DIR = Path(os.environ.get("MASCOT_TEST_SESSION_DIR") or tempfile.mkdtemp(prefix="mascot-tests-"))
WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # None in the controller, or without xdist (`-n 0`)
WORKER_DIR = SESSION_DIR / (WORKER or "main")
if WORKER:  # a worker starts with COLUMNS=80, which rich would make the CLI console's width when cli is imported;
    os.environ.pop("COLUMNS", None)  # a serial run has none, and tests that need a width pass it to the command
REPO = Path(__file__).resolve().parents[1]
os.environ.update(
    {
        "MASCOT_TEST_SESSION_DIR": str(SESSION_DIR),
        "MASCOT_CACHE_DIR": str(WORKER_DIR / "mascot-cache"),
        "PREFECT_HOME": str(WORKER_DIR / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "HF_HOME": str(WORKER_DIR / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(WORKER_DIR / "wandb"),
        "WANDB_CACHE_DIR": str(WORKER_DIR / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(WORKER_DIR / "wandb-config"),
        "TOKENIZERS_PARALLELISM": "false",
    }
)
(WORKER_DIR / "mascot-cache").mkdir(parents=True, exist_ok=True)
(SESSION_DIR / "tiny-models").mkdir(exist_ok=True)
if not (WORKER_DIR / "mascot-cache" / "tiny-models").exists():
    (WORKER_DIR / "mascot-cache" / "tiny-models").symlink_to(SESSION_DIR / "tiny-models")


def pytest_sessionfinish(session, exitstatus):
    if WORKER is None:  # the controller finishes last: a worker that finished first must not take the folder away
        shutil.rmtree(SESSION_DIR, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_config():
    from mascot.config import load_config

    return load_config(REPO / "configs" / "tiny.yaml")


@pytest.fixture(scope="session")
def tiny_models(tiny_config):
    """The tiny offline models of configs/tiny.yaml (test-sized warm start), built once per test session."""
    from stage1_runs import TEST_WARM_START

    from mascot.train.tiny import build_tiny_models

    spec = tiny_config.tiny.model_copy(update={"warm_start_steps": TEST_WARM_START})
    with open(SESSION_DIR / "tiny-models.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker builds; the others wait for it and find the build
        return build_tiny_models(spec, WORKER_DIR / "mascot-cache", progress=False)


def pytest_collection_modifyitems(config, items):
    """Files that need no tiny models run while the first file that needs them builds them.

    Each worker takes whole files in this order (pyproject's addopts). Collected as they are, both workers' first
    files need the tiny models, and one waits minutes on the build's lock. So: the first integration file that
    needs them, then the integration files that need none, then the other integration files, and the short unit
    files last, to even out the end.
    """
    files: dict[Path, list] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    integration = [path for path in files if "integration" in path.parts]
    needs_models = [path for path in integration if any("tiny_models" in item.fixturenames for item in files[path])]
    first = needs_models[:1]
    order = [*first, *(path for path in integration if path not in needs_models), *needs_models[1:],
             *(path for path in files if path not in integration)]
    items[:] = [item for path in order for item in files[path]]
