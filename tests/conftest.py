"""Test-session setup: every cache and home directory lives under one temporary folder.

The variables are set at import time, before transformers, prefect or wandb read them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

SESSION_DIR = Path(tempfile.mkdtemp(prefix="mascot-tests-"))
REPO = Path(__file__).resolve().parents[1]
os.environ.update(
    {
        "MASCOT_CACHE_DIR": str(SESSION_DIR / "mascot-cache"),
        "PREFECT_HOME": str(SESSION_DIR / "prefect"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "HF_HOME": str(SESSION_DIR / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(SESSION_DIR / "wandb"),
        "WANDB_CACHE_DIR": str(SESSION_DIR / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(SESSION_DIR / "wandb-config"),
        "TOKENIZERS_PARALLELISM": "false",
    }
)


def pytest_sessionfinish(session, exitstatus):
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
    return build_tiny_models(spec, SESSION_DIR / "mascot-cache", progress=False)
