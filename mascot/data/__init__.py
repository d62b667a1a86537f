"""Corpus loaders: Empathetic Dialogues, QMSum and ESConv, all producing `Context`.

`load_contexts` is the one entry point. It picks the loader for `source`, reads a local path (file
or directory in the corpus's release layout) or a Hugging Face Hub dataset, and applies a seeded,
reproducible subsample. Each loader module's docstring describes the exact format it accepts.
Malformed input raises `CorpusFormatError`, naming the file, the record and the field; there is no
mode that skips bad records.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mascot.data.context import Context, CorpusFormatError, Message, Split
from mascot.data.empathetic_dialogues import contexts_from_records as _ed_from_records
from mascot.data.empathetic_dialogues import load_empathetic_dialogues
from mascot.data.esconv import contexts_from_hub_rows as _esconv_from_hub_rows
from mascot.data.esconv import load_esconv
from mascot.data.qmsum import contexts_from_meetings as _qmsum_from_meetings
from mascot.data.qmsum import load_qmsum
from mascot.data.sampling import ensure_unique_ids, subsample
from mascot.data.sources import HUB_PARQUET_REVISION

if TYPE_CHECKING:
    from mascot.config import CorpusConfig

__all__ = [
    "SAMPLES_DIR",
    "SOURCES",
    "Context",
    "CorpusFormatError",
    "Message",
    "load_contexts",
    "load_corpus",
    "normalize_split",
]

SOURCES = ("empathetic_dialogues", "qmsum", "esconv")
SAMPLES_DIR = Path(__file__).parent / "samples"
"""Small original sample files in each corpus's release format (see samples/README.md)."""

# ESConv is the held-out out-of-domain set and has no split of its own, so it defaults to test.
DEFAULT_SPLIT: dict[str, Split] = {"empathetic_dialogues": "train", "qmsum": "train", "esconv": "test"}
_SPLIT_ALIASES: dict[str, Split] = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
}
# Hub datasets name their validation split differently; these are tried in order.
_HUB_SPLIT_NAMES: dict[Split, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("validation", "valid", "val"),
    "test": ("test",),
}


def normalize_split(split: str) -> Split:
    """`valid`, `val` and `dev` mean `validation`; anything else unknown is an error."""
    try:
        return _SPLIT_ALIASES[split.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(_SPLIT_ALIASES)}") from None


def load_contexts(
    source: str,
    path: str | Path | None = None,
    *,
    hub_name: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    window_turns: int = 16,
    window_stride: int | None = None,
) -> list[Context]:
    """Load contexts of one corpus split.

    Args:
        source: one of `SOURCES`.
        path: a local file or directory in the corpus's release layout. Exactly one of `path`/`hub_name`.
        hub_name: a Hugging Face Hub dataset name; its parquet conversion is loaded with `datasets.load_dataset`
            (needs network).
        split: train / validation (alias valid, val, dev) / test. Default: test for esconv, else train.
        limit: keep this many contexts, chosen reproducibly by `seed`; None or more than exist keeps all.
        seed: the subsampling seed.
        window_turns: QMSum only: the most turns in one meeting window.
        window_stride: QMSum only: turns between window starts; default `window_turns` (no overlap).
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {list(SOURCES)}")
    if (path is None) == (hub_name is None):
        raise ValueError("pass exactly one of `path` (a local file or directory) and `hub_name`")
    resolved_split = normalize_split(split) if split is not None else DEFAULT_SPLIT[source]
    stride = window_turns if window_stride is None else window_stride
    if window_turns < 1 or stride < 1:
        raise ValueError(f"window_turns and window_stride must be >= 1, got {window_turns} and {stride}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")

    if path is not None:
        local = Path(path)
        if not local.exists():
            raise FileNotFoundError(f"{source}: {local} does not exist")
        if source == "empathetic_dialogues":
            contexts = load_empathetic_dialogues(local, resolved_split)
        elif source == "qmsum":
            contexts = load_qmsum(local, resolved_split, window_turns=window_turns, window_stride=stride)
        else:
            contexts = load_esconv(local, resolved_split)
    else:
        assert hub_name is not None
        rows, hub_source = _load_hub_rows(hub_name, resolved_split)
        if source == "empathetic_dialogues":
            contexts = _ed_from_records(rows, source_name=hub_source, split=resolved_split)
        elif source == "qmsum":
            contexts = _qmsum_from_meetings(
                ((f"row {i}", row) for i, row in enumerate(rows)),
                source_name=hub_source,
                split=resolved_split,
                folder_meeting_type=None,
                window_turns=window_turns,
                window_stride=stride,
            )
        else:
            contexts = _esconv_from_hub_rows(rows, source_name=hub_source, split=resolved_split)
    ensure_unique_ids(contexts)
    return subsample(contexts, limit, seed)


def load_corpus(corpus: CorpusConfig, *, limit: int | None = None, seed: int = 0) -> list[Context]:
    """`load_contexts` for a config's corpus entry; `limit` overrides the entry's own limit."""
    return load_contexts(corpus.source, corpus.path, hub_name=corpus.hub_name, split=corpus.split,
                         limit=limit or corpus.limit, seed=seed, window_turns=corpus.window_turns,
                         window_stride=corpus.window_stride)


def _load_hub_rows(hub_name: str, split: Split) -> tuple[list[Mapping[str, Any]], str]:
    """Rows of a hub dataset split, trying the usual names of the split; a clear error when unreachable."""
    import datasets  # imported here: it is slow to import and only the hub path needs it

    failures = []
    for name in _HUB_SPLIT_NAMES[split]:
        try:
            # The parquet conversion, not the main branch: datasets >= 4 refuses a dataset whose main branch
            # is a loading script (facebook/empathetic_dialogues is one), and the conversion is plain parquet.
            dataset = datasets.load_dataset(hub_name, split=name, revision=HUB_PARQUET_REVISION)
        except Exception as error:  # noqa: BLE001 - re-raised below with every attempt listed
            failures.append(f"split {name!r}: {type(error).__name__}: {error}")
            continue
        return [dict(row) for row in dataset], f"hf://{hub_name}@{HUB_PARQUET_REVISION}[{name}]"
    raise RuntimeError(
        f"could not load {hub_name!r} from the Hugging Face Hub ({'; '.join(failures)}). "
        "The hub may be unreachable from this machine (offline or blocked); download the corpus and "
        "pass its local path with `path=` instead (`mascot data fetch --config C` downloads the release files)."
    )
