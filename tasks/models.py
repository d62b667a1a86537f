"""The tiny offline models as a step of every flow: built (minutes on a CPU) or found in their cache.

A step of its own, so the build has a state and a place on the flow run's timeline in the UI, log
lines, and the builder's progress bar in the terminal, rather than minutes of silence in the flow's
body. It is not cached by Prefect: the models' folder is their cache (`mascot.train.tiny`), keyed by
everything the build reads, and a deleted or edited cache must be noticed, as `write_contexts` notices
an edited corpus.
"""

from __future__ import annotations

import time

from prefect import get_run_logger, task

from mascot.config import RunConfig
from mascot.train.tiny import resolve_tiny_models
from tasks.failures import REPORTED


@task(**REPORTED)
def build_tiny_models(config: RunConfig, trainers: bool = True, stage2: bool = True) -> RunConfig:
    """`config` with every `tiny:` model reference it needs naming a built folder (`resolve_tiny_models`)."""
    logger = get_run_logger()
    logger.info("tiny models: found in %s, or built there (minutes on a CPU the first time)", config.cache.root)
    began = time.monotonic()
    resolved = resolve_tiny_models(config, progress=True, trainers=trainers, stage2=stage2)
    before = config.model_refs()
    folders = sorted({ref for loc, ref in resolved.model_refs().items() if ref != before[loc]})
    if folders:
        logger.info("tiny models ready after %.1f s: %s", time.monotonic() - began, ", ".join(folders))
    else:
        logger.info("no step of this run uses a tiny model: nothing built")
    return resolved
