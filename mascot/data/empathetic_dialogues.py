"""Empathetic Dialogues (Rashkin et al., 2019) loader.

Accepted formats
----------------
1. The original release (`empatheticdialogues.tar.gz` → `empatheticdialogues/{train,valid,test}.csv`).
   One row per utterance, header `conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags`.
   `context` is the emotion label (one of 32), `prompt` the situation. Commas inside text are written
   as `_comma_`. The file is not strict CSV: text is never quoted and some rows carry extra trailing
   fields, so it is read the way the corpus's own readers (ParlAI) read it: split each line on ",".
   Columns are located by the header; extra trailing fields are ignored; a row with fewer fields
   than the header is an error. Splits: `train.csv`, `valid.csv` (split "validation"), `test.csv`.
2. Parquet mirrors with one row per conversation (e.g. Hugging Face `Estwld/empathetic_dialogues_llm`,
   files `data/{train,valid,test}-*.parquet`): columns `conv_id`, `conversations` (a list of
   `{role, content}` with role `user` for the speaker and `assistant` for the listener), the emotion
   in `emotion` (or `context`), and the situation in `situation` (or `prompt`, optional).
3. Parquet files or hub rows with the release's per-utterance columns (format 1 as a table).

What a context is
-----------------
The speaker of the first utterance is the person being supported (role `user`); the other
participant is the listener (role `assistant`). `Message.name` keeps `speaker_idx`. The history is
cut after the last speaker turn so a companion can answer it; the listener turn that followed, if
any, is kept as `metadata["reference_response"]`. Context id: `ed:<split>:<conv_id>`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from mascot.data.context import Context, CorpusFormatError, Message, Split
from mascot.data.valence import valence_of

logger = logging.getLogger(__name__)

SOURCE = "empathetic_dialogues"
RELEASE_COLUMNS = (
    "conv_id",
    "utterance_idx",
    "context",
    "prompt",
    "speaker_idx",
    "utterance",
    "selfeval",
    "tags",
)
CSV_FILE_OF_SPLIT: dict[str, str] = {"train": "train.csv", "validation": "valid.csv", "test": "test.csv"}
MIRROR_NAMES_OF_SPLIT: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("validation", "valid"),
    "test": ("test",),
}
MIRROR_ROLES = ("user", "assistant")


def unescape(text: str) -> str:
    """Undo the release's comma escaping."""
    return text.replace("_comma_", ",")


def load_empathetic_dialogues(path: Path, split: Split) -> list[Context]:
    """Load one split from a release CSV, a parquet file, or a directory holding either layout."""
    files = find_split_files(path, split) if path.is_dir() else [path]
    contexts: list[Context] = []
    for file in files:
        if file.suffix == ".csv":
            contexts += contexts_from_utterance_rows(read_release_csv(file), source_name=file, split=split)
        elif file.suffix == ".parquet":
            contexts += contexts_from_records(pl.read_parquet(file).to_dicts(), source_name=file, split=split)
        else:
            raise ValueError(f"{file}: expected an Empathetic Dialogues .csv or .parquet file")
    return contexts


def find_split_files(directory: Path, split: Split) -> list[Path]:
    """The split's file(s) in the release layout or a parquet mirror layout."""
    csv_name = CSV_FILE_OF_SPLIT[split]
    looked_for = [
        directory / csv_name,
        directory / "empatheticdialogues" / csv_name,
        directory / "empatheticdialogues" / "empatheticdialogues" / csv_name,
    ]
    for candidate in looked_for:
        if candidate.is_file():
            return [candidate]
    patterns = [
        f"{folder}{name}{suffix}"
        for name in MIRROR_NAMES_OF_SPLIT[split]
        for folder in ("", "data/")
        for suffix in ("-*.parquet", ".parquet")
    ]
    for pattern in patterns:
        found = sorted(directory.glob(pattern))
        if found:
            return found
    wanted = [str(p) for p in looked_for] + [str(directory / p) for p in patterns]
    raise FileNotFoundError(f"no Empathetic Dialogues '{split}' file under {directory}; looked for: {wanted}")


def read_release_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a release CSV as dicts of the header's columns, each with `_record` = its line number."""
    # utf-8-sig: a byte-order mark written by a spreadsheet export must not hide the first column name.
    with open(path, encoding="utf-8-sig", newline="") as handle:
        # Split on "\n" only, as the release's own readers do; text may contain other line separators.
        lines = [line.rstrip("\r") for line in handle.read().split("\n")]
    if not lines or not lines[0].strip():
        raise CorpusFormatError(
            path, "line 1 (header)", None, f"missing header; expected {','.join(RELEASE_COLUMNS)}"
        )
    header = [name.strip() for name in lines[0].split(",")]
    for column in RELEASE_COLUMNS:
        if column not in header:
            raise CorpusFormatError(
                path,
                "line 1 (header)",
                column,
                f"missing column; expected header {','.join(RELEASE_COLUMNS)}",
            )
    position = {column: header.index(column) for column in RELEASE_COLUMNS}
    rows = []
    for line_number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) < len(header):
            raise CorpusFormatError(
                path,
                f"line {line_number}",
                header[len(fields)],
                f"row has {len(fields)} fields but the header has {len(header)}",
            )
        row: dict[str, Any] = {column: fields[position[column]] for column in RELEASE_COLUMNS}
        row["_record"] = f"line {line_number}"
        rows.append(row)
    return rows


def contexts_from_records(
    records: Iterable[Mapping[str, Any]], *, source_name: object, split: Split
) -> list[Context]:
    """Contexts from table rows (parquet or hub), either one row per conversation or per utterance."""
    rows = [dict(record, _record=f"row {index}") for index, record in enumerate(records)]
    if not rows:
        return []
    if "conversations" in rows[0]:
        return _contexts_from_conversation_rows(rows, source_name=source_name, split=split)
    if "utterance" in rows[0]:
        for row in rows:
            for column in RELEASE_COLUMNS[:6]:
                if column not in row:
                    raise CorpusFormatError(source_name, row["_record"], column, "missing column")
        return contexts_from_utterance_rows(rows, source_name=source_name, split=split)
    raise CorpusFormatError(
        source_name,
        "row 0",
        "conversations",
        f"missing column; expected a `conversations` column (one row per conversation) or the release's "
        f"per-utterance columns {RELEASE_COLUMNS[:6]}, found {sorted(k for k in rows[0] if k != '_record')}",
    )


def contexts_from_utterance_rows(
    rows: list[dict[str, Any]], *, source_name: object, split: Split
) -> list[Context]:
    """Group per-utterance rows by conv_id (first-seen order) and build one context per conversation."""
    conversations: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        conv_id = str(row["conv_id"]).strip()
        if not conv_id:
            raise CorpusFormatError(source_name, row["_record"], "conv_id", "empty conversation id")
        conversations.setdefault(conv_id, []).append(row)
    built = [_context_from_utterances(cid, group, source_name, split) for cid, group in conversations.items()]
    return _keep_usable(built, source_name)


def _context_from_utterances(
    conv_id: str, rows: list[dict[str, Any]], source_name: object, split: Split
) -> Context | None:
    record = f"{rows[0]['_record']} (conv_id {conv_id})"
    by_index: dict[int, dict[str, Any]] = {}
    for row in rows:
        raw = str(row["utterance_idx"]).strip()
        if not raw.isdigit():
            raise CorpusFormatError(
                source_name, row["_record"], "utterance_idx", f"expected an integer, got {raw!r}"
            )
        if int(raw) in by_index:
            raise CorpusFormatError(
                source_name, row["_record"], "utterance_idx", f"duplicate utterance_idx {raw}"
            )
        by_index[int(raw)] = row
    ordered = [by_index[i] for i in sorted(by_index)]
    speakers: list[str] = []
    for row in ordered:
        speaker = str(row["speaker_idx"]).strip()
        if not speaker:
            raise CorpusFormatError(source_name, row["_record"], "speaker_idx", "empty speaker_idx")
        if speaker not in speakers:
            speakers.append(speaker)
    if len(speakers) > 2:
        raise CorpusFormatError(
            source_name,
            record,
            "speaker_idx",
            f"conversation has {len(speakers)} distinct speakers {speakers}; expected two (speaker and listener)",
        )
    seeker = speakers[0]  # the speaker of the first utterance is the one describing their situation
    messages = []
    for row in ordered:
        text = unescape(str(row["utterance"])).strip()
        if not text:
            raise CorpusFormatError(
                source_name, f"{row['_record']} (conv_id {conv_id})", "utterance", "empty utterance text"
            )
        speaker = str(row["speaker_idx"]).strip()
        messages.append(
            Message(role="user" if speaker == seeker else "assistant", content=text, name=speaker)
        )
    first = ordered[0]
    extra = {key: first[key] for key in ("selfeval", "tags") if key in first and first[key] is not None}
    return _support_context(
        conv_id=conv_id,
        emotion=str(first["context"]),
        situation=unescape(str(first["prompt"])),
        messages=messages,
        split=split,
        source_name=source_name,
        record=record,
        emotion_field="context",
        extra_metadata=extra,
    )


def _contexts_from_conversation_rows(
    rows: list[dict[str, Any]], *, source_name: object, split: Split
) -> list[Context]:
    built = []
    for row in rows:
        record = row["_record"]
        emotion_field = "emotion" if "emotion" in row else "context"
        for column in ("conv_id", emotion_field):
            if column not in row or row[column] is None:
                raise CorpusFormatError(source_name, record, column, "missing column")
        turns = row["conversations"]
        if not isinstance(turns, list) or not turns:
            raise CorpusFormatError(source_name, record, "conversations", "empty dialogue: no turns")
        messages = []
        for i, turn in enumerate(turns):
            field = f"conversations[{i}]"
            if not isinstance(turn, Mapping) or "role" not in turn or "content" not in turn:
                raise CorpusFormatError(
                    source_name, record, field, "expected an object with `role` and `content`"
                )
            if turn["role"] not in MIRROR_ROLES:
                raise CorpusFormatError(
                    source_name,
                    record,
                    f"{field}.role",
                    f"unknown role {turn['role']!r}; expected {MIRROR_ROLES}",
                )
            text = unescape(str(turn["content"] or "")).strip()
            if not text:
                raise CorpusFormatError(source_name, record, f"{field}.content", "empty utterance text")
            messages.append(Message(role=turn["role"], content=text))
        situation_field = "situation" if "situation" in row else "prompt"
        situation = row.get(situation_field)
        built.append(
            _support_context(
                conv_id=str(row["conv_id"]).strip(),
                emotion=str(row[emotion_field]),
                situation=unescape(str(situation)) if situation is not None else None,
                messages=messages,
                split=split,
                source_name=source_name,
                record=f"{record} (conv_id {row['conv_id']})",
                emotion_field=emotion_field,
                extra_metadata={},
            )
        )
    return _keep_usable(built, source_name)


def _support_context(
    *,
    conv_id: str,
    emotion: str,
    situation: str | None,
    messages: list[Message],
    split: Split,
    source_name: object,
    record: str,
    emotion_field: str,
    extra_metadata: dict[str, Any],
) -> Context | None:
    """A context cut after the last seeker turn; None when the seeker never speaks."""
    valence = valence_of(emotion)
    if valence is None:
        raise CorpusFormatError(
            source_name,
            record,
            emotion_field,
            f"unknown emotion label {emotion!r}; expected one of the 32 ED emotions",
        )
    seeker_turns = [i for i, message in enumerate(messages) if message.role == "user"]
    if not seeker_turns:
        return None
    cut = seeker_turns[-1] + 1
    return Context(
        id=f"ed:{split}:{conv_id}",
        domain="emotional_support",
        source=SOURCE,
        split=split,
        valence=valence,
        history=messages[:cut],
        metadata={
            "conv_id": conv_id,
            "emotion": emotion.strip().lower(),
            "situation": situation.strip() if situation is not None else None,
            "reference_response": messages[cut].content if cut < len(messages) else None,
            "n_turns": len(messages),
            **extra_metadata,
        },
    )


def _keep_usable(built: list[Context | None], source_name: object) -> list[Context]:
    contexts = [context for context in built if context is not None]
    dropped = len(built) - len(contexts)
    if dropped:
        logger.warning(
            "%s: dropped %d conversation(s) in which the seeker never speaks", source_name, dropped
        )
    return contexts
