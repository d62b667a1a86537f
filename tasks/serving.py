"""The step that puts a trained adapter on the serving engine before a served role's first request.

Never cached: what a server serves changes when it restarts, so a resumed run checks (and loads) again. A
failure names the step and says what to do (`mascot.llm.served_adapters`).
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from mascot.artifacts import Artifact
from mascot.config import BackendConfig
from mascot.llm import served_adapters
from tasks.failures import REPORTED


@task(cache_policy=NO_CACHE, **REPORTED)
def serve_adapter(config: BackendConfig, role: str, adapter: Artifact | None, run_root: Path) -> BackendConfig:
    """`config` pointing at `adapter` on its server, under a name that carries the adapter's hash (loaded now
    where `load_adapter` is set, checked where a person serves it); in-process backends unchanged."""
    return served_adapters.serve_adapter(config, role, adapter, run_root)


def serves(config: BackendConfig | None) -> bool:
    """Whether a trained role's configured backend is a server, so its adapter must be on it."""
    return config is not None and config.kind == "openai"


def needs_adapter(config: BackendConfig | None) -> bool:
    """Whether a trained role cannot run without the run's adapter: in this process, or loaded by the flow. A
    module served by hand can (the run may have stopped before training it); its adapter is used where recorded."""
    return config is None or config.kind != "openai" or config.load_adapter
