"""QMSum (Zhong et al., 2021) loader: query-based meeting summarisation, cut into windows of turns.

Accepted format
---------------
JSON Lines, one meeting per line, as released in github.com/Yale-LILY/QMSum:
`data/ALL/jsonl/{train,val,test}.jsonl` (all domains) and `data/<Domain>/jsonl/{train,val,test}.jsonl`
with Domain in Academic, Product, Committee. Each meeting is an object with

- `meeting_transcripts`: `[{speaker, content}]`, the turns (non-empty list; every speaker non-empty);
- `topic_list`: `[{topic, relevant_text_span}]`;
- `general_query_list`: `[{query, answer}]` (about the whole meeting, so no spans);
- `specific_query_list`: `[{query, answer, relevant_text_span}]`.

`relevant_text_span` is a list of `[start, end]` pairs of integer strings, inclusive at both ends,
indexing `meeting_transcripts`. A span that is not integer, has start > end, or runs past the last
turn is an error. The release contains turns with empty `content`: they keep their index (spans
count them) but are left out of the history, and the number left out is recorded per window.

Meeting type
------------
From the folder name when the path has an `Academic`, `Product` or `Committee` component
(`metadata["meeting_type_source"] = "folder"`). Otherwise (the `ALL` folder, a hub dataset) it is
inferred from the speaker labels (`"speakers"`): AMI product-design meetings label speakers by
role (Project Manager, Marketing, User Interface, Industrial Designer) → Product; ICSI research
meetings label them by position and a letter (Professor D, PhD A, Grad C, Postdoc, Undergrad) →
Academic; committee transcripts use people's names and titles → Committee.

Windows
-------
A meeting of n turns becomes windows of at most `window_turns` turns starting every `window_stride`
turns (default: `window_turns`, i.e. non-overlapping); the last window ends at the last turn. All
turns are `role="user"` with `name=<speaker>`. Jsonl lines carry no meeting id, so a meeting's id
is the first 12 hex digits of the SHA-256 of its transcript: the same meeting gets the same id
whether read from `ALL` or a domain folder. Context id: `qmsum:<split>:<meeting id>#w<k>`.
Metadata: the turn range (inclusive), the topics and specific queries whose spans overlap the
window (spans clipped to it), and the meeting's general queries.

Query
-----
A window is "about" one query, which every role's prompt shows (Speaker, Director, simulated user,
judges): `meeting_query` picks it from the metadata. Answers never reach a prompt; they are the
corpus's reference summaries.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from mascot.data.context import Context, CorpusFormatError, Message, Split

logger = logging.getLogger(__name__)

SOURCE = "qmsum"
MeetingType = Literal["Academic", "Product", "Committee"]
MEETING_TYPES: tuple[MeetingType, ...] = ("Academic", "Product", "Committee")
JSONL_FILE_OF_SPLIT: dict[str, str] = {
    "train": "train.jsonl",
    "validation": "val.jsonl",
    "test": "test.jsonl",
}
REQUIRED_KEYS = ("meeting_transcripts", "topic_list", "general_query_list", "specific_query_list")
PRODUCT_SPEAKERS = frozenset({"project manager", "marketing", "user interface", "industrial designer"})
ACADEMIC_SPEAKER_PREFIXES = frozenset({"professor", "phd", "grad", "postdoc", "undergrad"})

Span = tuple[int, int]


def load_qmsum(path: Path, split: Split, *, window_turns: int, window_stride: int) -> list[Context]:
    """Load one split from a jsonl file or a directory in the release layout."""
    files = find_split_files(path, split) if path.is_dir() else [path]
    contexts: list[Context] = []
    for file in files:
        contexts += contexts_from_meetings(
            read_jsonl(file),
            source_name=file,
            split=split,
            folder_meeting_type=meeting_type_from_path(file),
            window_turns=window_turns,
            window_stride=window_stride,
        )
    return contexts


def find_split_files(directory: Path, split: Split) -> list[Path]:
    """The split's jsonl: directly, under `jsonl/`, under `ALL/` or `data/ALL/`, else every domain folder."""
    name = JSONL_FILE_OF_SPLIT[split]
    looked_for = [directory / prefix / name for prefix in ("", "jsonl", "ALL/jsonl", "data/ALL/jsonl")]
    for candidate in looked_for:
        if candidate.is_file():
            return [candidate]
    for root in (directory, directory / "data"):
        per_domain = [root / domain / "jsonl" / name for domain in MEETING_TYPES]
        looked_for += per_domain
        if any(p.is_file() for p in per_domain):
            return [p for p in per_domain if p.is_file()]
    raise FileNotFoundError(
        f"no QMSum '{split}' file under {directory}; looked for: {[str(p) for p in looked_for]}"
    )


def meeting_type_from_path(path: Path) -> MeetingType | None:
    """The domain named by the nearest Academic/Product/Committee folder in the path, if any."""
    for part in reversed(path.parts):
        for meeting_type in MEETING_TYPES:
            if part.lower() == meeting_type.lower():
                return meeting_type
    return None


def infer_meeting_type(speakers: Iterable[str]) -> MeetingType:
    """Product for AMI role labels, Academic for ICSI position labels, else Committee (see module doc)."""
    labels = {speaker.strip().lower() for speaker in speakers}
    if labels & PRODUCT_SPEAKERS:
        return "Product"
    if any(label.split()[0] in ACADEMIC_SPEAKER_PREFIXES for label in labels if label):
        return "Academic"
    return "Committee"


def read_jsonl(path: Path) -> list[tuple[str, Any]]:
    """(record label, parsed object) per non-blank line; bad JSON names the line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append((f"line {line_number}", json.loads(line)))
            except json.JSONDecodeError as error:
                raise CorpusFormatError(
                    path, f"line {line_number}", None, f"invalid JSON: {error.msg} at column {error.colno}"
                ) from error
    return records


def window_bounds(n_turns: int, window_turns: int, window_stride: int) -> list[tuple[int, int]]:
    """Inclusive (start, end) turn ranges; the last window reaches the last turn."""
    bounds, start = [], 0
    while True:
        end = min(start + window_turns, n_turns) - 1
        bounds.append((start, end))
        if end >= n_turns - 1:
            return bounds
        start += window_stride


def contexts_from_meetings(
    records: Iterable[tuple[str, Any]],
    *,
    source_name: object,
    split: Split,
    folder_meeting_type: MeetingType | None,
    window_turns: int,
    window_stride: int,
) -> list[Context]:
    contexts: list[Context] = []
    seen_ids: dict[str, int] = {}
    skipped_windows = 0
    for record, meeting in records:
        parsed = _parse_meeting(meeting, source_name, record)
        digest = hashlib.sha256(
            json.dumps(meeting["meeting_transcripts"], sort_keys=True, ensure_ascii=False).encode()
        ).hexdigest()[:12]
        # A meeting repeated in one load keeps distinct ids, numbered in file order.
        seen_ids[digest] = seen_ids.get(digest, 0) + 1
        meeting_id = digest if seen_ids[digest] == 1 else f"{digest}-{seen_ids[digest]}"
        speakers = [speaker for speaker, _ in parsed["turns"]]
        meeting_type = folder_meeting_type or infer_meeting_type(speakers)
        bounds = window_bounds(len(parsed["turns"]), window_turns, window_stride)
        for k, (start, end) in enumerate(bounds):
            history = [
                Message(role="user", content=content.strip(), name=speaker)
                for speaker, content in parsed["turns"][start : end + 1]
                if content.strip()
            ]
            if not history:
                skipped_windows += 1
                continue
            contexts.append(
                Context(
                    id=f"qmsum:{split}:{meeting_id}#w{k}",
                    domain="meetings",
                    source=SOURCE,
                    split=split,
                    meeting_type=meeting_type,
                    history=history,
                    metadata={
                        "meeting_id": meeting_id,
                        "source_record": f"{_short_name(source_name)}:{record}",
                        "meeting_type_source": "folder" if folder_meeting_type else "speakers",
                        "window_index": k,
                        "n_windows": len(bounds),
                        "turn_range": [start, end],
                        "n_meeting_turns": len(parsed["turns"]),
                        "empty_turns_omitted": (end - start + 1) - len(history),
                        "topics": _overlapping(parsed["topics"], "topic", start, end),
                        "specific_queries": _overlapping(parsed["specific_queries"], "query", start, end),
                        "general_queries": parsed["general_queries"],
                    },
                )
            )
    if skipped_windows:
        logger.warning("%s: skipped %d window(s) whose turns are all empty", source_name, skipped_windows)
    return contexts


def meeting_query(context: Context) -> str | None:
    """The query a context is about, or None when it has none (every non-QMSum context).

    Of the specific queries overlapping the window, the one whose relevant spans cover the most of
    its turns: the window holds most of the discussion that query asks about. A tie goes to the
    query listed first in the release, so the choice is the same on every load. A window that no
    specific query overlaps gets the meeting's first general query ("summarise the meeting"), which
    is about every window. Reads only the metadata the loader writes, so contexts read back from
    contexts.parquet get the same query.
    """
    specific = context.metadata.get("specific_queries") or []
    if specific:
        # max() keeps the first of equal keys: the release's order breaks ties.
        best = max(specific, key=lambda q: len({t for s, e in q["spans"] for t in range(s, e + 1)}))
        return best["query"]
    general = context.metadata.get("general_queries") or []
    return general[0]["query"] if general else None


def _short_name(source_name: object) -> str:
    """The file's last three path parts (e.g. `Product/jsonl/train.jsonl`), never a machine-specific path."""
    if isinstance(source_name, Path):
        return "/".join(source_name.parts[-3:])
    return str(source_name)


def _overlapping(items: list[dict[str, Any]], key: str, start: int, end: int) -> list[dict[str, Any]]:
    """Items with at least one span overlapping [start, end], spans clipped to the window."""
    kept = []
    for item in items:
        spans = [[max(s, start), min(e, end)] for s, e in item["spans"] if s <= end and e >= start]
        if spans:
            kept.append({**{k: v for k, v in item.items() if k != "spans"}, "spans": spans})
    return kept


def _parse_meeting(meeting: Any, source_name: object, record: str) -> dict[str, Any]:
    if not isinstance(meeting, Mapping):
        raise CorpusFormatError(
            source_name, record, None, f"expected a JSON object, got {type(meeting).__name__}"
        )
    for key in REQUIRED_KEYS:
        if key not in meeting:
            raise CorpusFormatError(source_name, record, key, "missing key")
        if not isinstance(meeting[key], list):
            raise CorpusFormatError(
                source_name, record, key, f"expected a list, got {type(meeting[key]).__name__}"
            )
    transcript = meeting["meeting_transcripts"]
    if not transcript:
        raise CorpusFormatError(source_name, record, "meeting_transcripts", "empty dialogue: no turns")
    turns = []
    for i, turn in enumerate(transcript):
        field = f"meeting_transcripts[{i}]"
        if not isinstance(turn, Mapping):
            raise CorpusFormatError(
                source_name, record, field, "expected an object with `speaker` and `content`"
            )
        speaker = turn.get("speaker")
        if not isinstance(speaker, str) or not speaker.strip():
            raise CorpusFormatError(
                source_name, record, f"{field}.speaker", f"missing or empty speaker ({speaker!r})"
            )
        if not isinstance(turn.get("content"), str):
            raise CorpusFormatError(source_name, record, f"{field}.content", "missing key or not a string")
        turns.append((speaker.strip(), turn["content"]))
    n = len(turns)

    def items(list_key: str, text_keys: tuple[str, ...], with_spans: bool) -> list[dict[str, Any]]:
        parsed = []
        for i, item in enumerate(meeting[list_key]):
            field = f"{list_key}[{i}]"
            if not isinstance(item, Mapping):
                raise CorpusFormatError(source_name, record, field, "expected an object")
            entry: dict[str, Any] = {}
            for key in text_keys + (("relevant_text_span",) if with_spans else ()):
                if key not in item:
                    raise CorpusFormatError(source_name, record, f"{field}.{key}", "missing key")
            for key in text_keys:
                entry[key] = item[key]
            if with_spans:
                entry["spans"] = _parse_spans(item["relevant_text_span"], n, source_name, record, field)
            parsed.append(entry)
        return parsed

    return {
        "turns": turns,
        "topics": items("topic_list", ("topic",), with_spans=True),
        "specific_queries": items("specific_query_list", ("query", "answer"), with_spans=True),
        "general_queries": items("general_query_list", ("query", "answer"), with_spans=False),
    }


def _parse_spans(raw: Any, n_turns: int, source_name: object, record: str, item_field: str) -> list[Span]:
    field = f"{item_field}.relevant_text_span"
    if not isinstance(raw, list):
        raise CorpusFormatError(
            source_name, record, field, f"expected a list of [start, end] pairs, got {raw!r}"
        )
    spans = []
    for j, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            raise CorpusFormatError(
                source_name, record, f"{field}[{j}]", f"expected a [start, end] pair, got {pair!r}"
            )
        bounds = []
        for value in pair:
            # The release writes indices as strings ("12"); plain ints are accepted too, nothing else.
            if isinstance(value, bool) or not (
                isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())
            ):
                raise CorpusFormatError(
                    source_name,
                    record,
                    f"{field}[{j}]",
                    f"span bound {value!r} is not a non-negative integer",
                )
            bounds.append(int(value))
        start, end = bounds
        if start > end:
            raise CorpusFormatError(source_name, record, f"{field}[{j}]", f"span start {start} > end {end}")
        if end >= n_turns:
            raise CorpusFormatError(
                source_name,
                record,
                f"{field}[{j}]",
                f"span [{start}, {end}] runs past the last turn (index {n_turns - 1})",
            )
        spans.append((start, end))
    return spans
