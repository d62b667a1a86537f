"""Explicit cache keys: a task's source, the config slice it reads and the hashes of its inputs.

Every parameter of a cached task is one of those: a config slice (pydantic model), an `Artifact`
(path + content hash), or a plain value. Changing a rubric therefore changes the key of judging
and of everything downstream of it, and of nothing upstream.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

from pydantic import BaseModel

import mascot
from mascot.artifacts import canonical_json


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def artifact_cache_key(context, parameters: dict[str, Any]) -> str:
    """Prefect `cache_key_fn`: sha256 of the task's source, the library version and its parameters."""
    task = context.task
    digest = hashlib.sha256()
    digest.update(task.name.encode())
    digest.update(inspect.getsource(task.fn).encode())
    digest.update(mascot.__version__.encode())
    digest.update(canonical_json(_plain(parameters)).encode())
    return digest.hexdigest()
