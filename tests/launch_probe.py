"""Calls for `mascot.train.launch` to make in each process of a launch (the tests put this folder on PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path

from mascot.llm.limits import LIMITS_DIR


def where(log: Path) -> str:
    """Note this process's pid, its rank and the limits folder it was given; return the rank."""
    with log.open("a") as out:
        out.write(f"{os.getpid()} {os.environ['RANK']} {os.environ[LIMITS_DIR]}\n")
    return os.environ["RANK"]


def fail() -> None:
    raise RuntimeError("no room on the GPU")
