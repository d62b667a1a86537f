"""configs/paper.yaml as a CPU runs it: tests/data/paper_overlay.yaml merged into it (issue 34).

The project has no layering of configs, so the overlay is merged here, in tests, and configs/paper.yaml never
changes for it. Mappings merge key by key and lists of mappings item by item (a judge panel keeps its judges and
their order); any other value, a list of numbers included, is replaced. The overlay's `{vllm}`, `{judges}`,
`{runs}` and `{cache}` are filled in with the test's loopback servers and folders, and the profile's relative
file references (roster, rubrics) are made absolute, since the merged file is written elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from stage1_runs import REPO

PAPER = REPO / "configs" / "paper.yaml"
OVERLAY = REPO / "tests" / "data" / "paper_overlay.yaml"
# The server names the overlay's served roles use: the loopback vLLM serves the tiny LM under this name.
SERVED_BASE = "tiny-lm"


def merge(base: object, changes: object) -> object:
    """`base` with `changes` laid over it."""
    if isinstance(base, dict) and isinstance(changes, dict):
        return {**base, **{key: merge(base.get(key), value) for key, value in changes.items()}}
    if (isinstance(base, list) and isinstance(changes, list) and len(base) == len(changes)
            and all(isinstance(item, dict) for item in (*base, *changes))):
        return [merge(item, change) for item, change in zip(base, changes, strict=True)]
    return changes


def leaves(value: object, path: tuple = ()) -> dict[tuple, object]:
    """Every leaf of a nested mapping, by its path of keys and list indexes."""
    if isinstance(value, dict):
        return {leaf: found for key, item in value.items() for leaf, found in leaves(item, (*path, key)).items()}
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return {leaf: found for index, item in enumerate(value) for leaf, found in leaves(item, (*path, index)).items()}
    return {path: value}


def fill(value: object, slots: dict[str, str]) -> object:
    """`value` with each `{slot}` in its strings replaced."""
    if isinstance(value, dict):
        return {key: fill(item, slots) for key, item in value.items()}
    if isinstance(value, list):
        return [fill(item, slots) for item in value]
    if isinstance(value, str):
        for slot, text in slots.items():
            value = value.replace("{" + slot + "}", text)
    return value


def absolute_files(value: object, folder: Path) -> object:
    """`value` with each string that names a file in `folder` by a relative path made absolute."""
    if isinstance(value, dict):
        return {key: absolute_files(item, folder) for key, item in value.items()}
    if isinstance(value, list):
        return [absolute_files(item, folder) for item in value]
    if isinstance(value, str) and value.endswith(".yaml") and (folder / value).is_file():
        return str(folder / value)
    return value


def overlay_changes() -> dict:
    return yaml.safe_load(OVERLAY.read_text())


def paper_on_cpu(folder: Path, vllm: str, judges: str, name: str = "paper") -> Path:
    """Write configs/paper.yaml with the overlay to `folder`/`name`.yaml, its servers the loopback ones at `vllm`
    and `judges` (root URLs), its runs under `folder`/runs and its caches in `folder`/cache, which reuses the
    test session's tiny models (built once per session)."""
    import os

    cache = folder / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "tiny-models").exists():
        (cache / "tiny-models").symlink_to(Path(os.environ["MASCOT_CACHE_DIR"]) / "tiny-models")
    slots = {"vllm": f"{vllm}/v1", "judges": f"{judges}/v1", "runs": str(folder / "runs"), "cache": str(cache)}
    config = merge(yaml.safe_load(PAPER.read_text()), fill(overlay_changes(), slots))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(absolute_files(config, PAPER.parent), sort_keys=False))
    return path
