"""Explicit cache keys, and outputs named by them.

A task's key covers its own source, the source of the library modules it runs (`code_fingerprint`),
the package version and its parameters. Every parameter of a cached task is a config slice
(pydantic model), an `Artifact` (path + content hash) or a plain value, so changing a rubric, or
the judge's code, changes the key of judging and of everything downstream of it, and of nothing
upstream.

A cached task writes its output under a name derived from its key (`keyed`), never over the file
of another key. A cache hit therefore always names a file that is still on disk as it was written:
edit the corpus, rerun, revert the edit, rerun, and the second rerun's hits are the first run's
files, untouched by the run in between.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect.context import TaskRunContext
from pydantic import BaseModel

import mascot
from mascot.artifacts import canonical_json, keyed_path
from tasks.code_hash import code_fingerprint


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def defined_function(fn: Callable) -> Callable:
    """The task's function as its module defines it. A task run in another process (a Dask worker) runs a copy
    that was pickled by value and has no source file; the module's own function has, and gives the same key."""
    defined = getattr(importlib.import_module(fn.__module__), fn.__name__, None)
    defined = getattr(defined, "fn", defined)  # the module's name is bound to the task, whose `fn` it is
    return defined if getattr(defined, "__code__", None) is not None else fn


def artifact_cache_key(context, parameters: dict[str, Any]) -> str:
    """Prefect `cache_key_fn`: sha256 of the task's source, the code it runs, the version and its parameters."""
    task, fn = context.task, defined_function(context.task.fn)
    digest = hashlib.sha256()
    digest.update(task.name.encode())
    digest.update(inspect.getsource(fn).encode())
    digest.update(code_fingerprint(fn, *parameters.values()).encode())
    digest.update(mascot.__version__.encode())
    digest.update(canonical_json(_plain(parameters)).encode())
    return digest.hexdigest()


def keyed(out: Path) -> Path:
    """Where the running task writes `out`: beside it, in `steps/`, under a name that carries its cache key."""
    context = TaskRunContext.get()
    if context is None:
        raise RuntimeError("keyed() names a task's output by its cache key, so it must run inside a task")
    return keyed_path(out, artifact_cache_key(context, context.parameters))


# The options of every cached task: its key, and its result (paths and hashes) kept on disk.
CACHED = {"cache_key_fn": artifact_cache_key, "persist_result": True}
