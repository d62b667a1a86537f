"""ESConv (Liu et al., 2021, "Towards Emotional Support Dialog Systems") loader.

Accepted formats
----------------
1. The release file `ESConv.json` (github.com/thu-coai/Emotional-Support-Conversation): a JSON list
   of dialogues. Required keys: `experience_type`, `emotion_type`, `problem_type`, `situation`,
   `survey_score`, `dialog`. `survey_score` is `{"seeker": {...}, "supporter": {...}}` whose values are
   integer strings ("5"); each is parsed to int, and a non-integer value is an error (a missing
   sub-score is simply absent, as in the release). `dialog` is `[{speaker, annotation, content}]`
   with speaker `seeker` or `supporter`; supporter annotations carry `strategy`, seeker annotations
   may carry `feedback`. `seeker_question1/2` and `supporter_question1/2` are kept when present.
2. The Hugging Face copy `thu-coai/esconv` (hub rows `{"text": "<json>"}`): the maintainers'
   processed form, turns `{text, speaker: usr|sys, strategy}`, no survey scores or experience type.

Splits
------
ESConv is the held-out, out-of-domain set and the release file has no split, so the whole file is
loaded and labelled with the requested split (default `test`, chosen by `load_contexts`).

What a context is
-----------------
Seeker turns are `role="user"`, supporter turns `role="assistant"`; `Message.name` keeps the
release's speaker label. Consecutive turns by one speaker stay separate messages, as in the
release. Turns with empty content are left out and counted. The history is cut after the last
seeker turn; a dialogue in which the seeker never speaks is dropped and counted in a warning.
The supporter turn that followed the cut, and its strategy, are kept as the reference response.
Valence is `negative` for every dialogue: ESConv seekers are in distress by construction, and its
emotion labels (anxiety, depression, sadness, anger, fear, shame, disgust, ...) are not among the
32 Empathetic Dialogues labels, so the valence table cannot place them.
Context id: `esconv:<split>:<index of the dialogue in the file>`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mascot.data.context import Context, CorpusFormatError, Message, Split

logger = logging.getLogger(__name__)

SOURCE = "esconv"
RELEASE_FILE = "ESConv.json"
RELEASE_KEYS = ("experience_type", "emotion_type", "problem_type", "situation", "survey_score", "dialog")
PROCESSED_KEYS = ("emotion_type", "problem_type", "situation", "dialog")
ROLE_OF_SPEAKER = {"seeker": "user", "supporter": "assistant"}
ROLE_OF_PROCESSED_SPEAKER = {"usr": "user", "sys": "assistant"}
OPTIONAL_TEXT_KEYS = ("seeker_question1", "seeker_question2", "supporter_question1", "supporter_question2")


def load_esconv(path: Path, split: Split) -> list[Context]:
    """Load the whole release file (or `<dir>/ESConv.json`) as one split."""
    if path.is_dir():
        candidate = path / RELEASE_FILE
        if not candidate.is_file():
            raise FileNotFoundError(f"no ESConv file under {path}; looked for: {[str(candidate)]}")
        path = candidate
    try:
        dialogues = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise CorpusFormatError(
            path,
            f"JSON document at line {error.lineno}, column {error.colno} (char {error.pos})",
            None,
            f"invalid JSON: {error.msg}",
        ) from error
    if not isinstance(dialogues, list):
        raise CorpusFormatError(path, "top level", None, "expected a JSON list of dialogues")
    return contexts_from_dialogues(enumerate(dialogues), source_name=path, split=split, processed=False)


def contexts_from_hub_rows(
    rows: Iterable[Mapping[str, Any]], *, source_name: object, split: Split
) -> list[Context]:
    """Hub rows: either release-form dialogues or `{"text": "<json>"}` processed rows."""
    indexed: list[tuple[int, Any]] = []
    processed = False
    for index, row in enumerate(rows):
        if set(row) == {"text"}:
            processed = True
            try:
                indexed.append((index, json.loads(row["text"])))
            except json.JSONDecodeError as error:
                raise CorpusFormatError(
                    source_name, f"dialogue {index}", "text", f"invalid JSON: {error.msg} (char {error.pos})"
                ) from error
        else:
            indexed.append((index, row))
    return contexts_from_dialogues(indexed, source_name=source_name, split=split, processed=processed)


def contexts_from_dialogues(
    dialogues: Iterable[tuple[int, Any]], *, source_name: object, split: Split, processed: bool
) -> list[Context]:
    contexts, dropped = [], 0
    for index, dialogue in dialogues:
        context = _context_from_dialogue(index, dialogue, source_name, split, processed)
        if context is None:
            dropped += 1
        else:
            contexts.append(context)
    if dropped:
        logger.warning("%s: dropped %d dialogue(s) in which the seeker never speaks", source_name, dropped)
    return contexts


def parse_survey_score(raw: Any, source_name: object, record: str) -> dict[str, dict[str, int]]:
    """`{"seeker": {"empathy": "5"}}` → `{"seeker": {"empathy": 5}}`; anything non-integer is an error."""
    if not isinstance(raw, Mapping):
        raise CorpusFormatError(source_name, record, "survey_score", f"expected an object, got {raw!r}")
    scores: dict[str, dict[str, int]] = {}
    for rater, items in raw.items():
        if not isinstance(items, Mapping):
            raise CorpusFormatError(
                source_name, record, f"survey_score.{rater}", f"expected an object, got {items!r}"
            )
        scores[rater] = {}
        for name, value in items.items():
            text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
            if not text.lstrip("-").isdigit():
                raise CorpusFormatError(
                    source_name,
                    record,
                    f"survey_score.{rater}.{name}",
                    f"expected an integer score, got {value!r}",
                )
            scores[rater][name] = int(text)
    return scores


def _context_from_dialogue(
    index: int, dialogue: Any, source_name: object, split: Split, processed: bool
) -> Context | None:
    record = f"dialogue {index}"
    if not isinstance(dialogue, Mapping):
        raise CorpusFormatError(
            source_name, record, None, f"expected a JSON object, got {type(dialogue).__name__}"
        )
    for key in PROCESSED_KEYS if processed else RELEASE_KEYS:
        if key not in dialogue:
            raise CorpusFormatError(source_name, record, key, "missing key")
    turns = dialogue["dialog"]
    if not isinstance(turns, list) or not turns:
        raise CorpusFormatError(source_name, record, "dialog", "empty dialogue: no turns")
    roles = ROLE_OF_PROCESSED_SPEAKER if processed else ROLE_OF_SPEAKER
    text_key = "text" if processed else "content"
    messages: list[Message] = []
    annotations: list[dict[str, Any]] = []
    empty_turns = 0
    for i, turn in enumerate(turns):
        field = f"dialog[{i}]"
        if not isinstance(turn, Mapping):
            raise CorpusFormatError(source_name, record, field, "expected an object")
        for key in ("speaker", text_key):
            if key not in turn:
                raise CorpusFormatError(source_name, record, f"{field}.{key}", "missing key")
        if turn["speaker"] not in roles:
            raise CorpusFormatError(
                source_name,
                record,
                f"{field}.speaker",
                f"unknown speaker {turn['speaker']!r}; expected {list(roles)}",
            )
        content = str(turn[text_key] or "").strip()
        if not content:
            empty_turns += 1
            continue
        messages.append(Message(role=roles[turn["speaker"]], content=content, name=turn["speaker"]))
        annotation = turn.get("annotation", {"strategy": turn["strategy"]} if "strategy" in turn else {})
        annotations.append(dict(annotation) if isinstance(annotation, Mapping) else {})
    if not messages:
        raise CorpusFormatError(source_name, record, "dialog", "empty dialogue: every turn has empty content")
    seeker_turns = [i for i, message in enumerate(messages) if message.role == "user"]
    if not seeker_turns:
        return None
    cut = seeker_turns[-1] + 1
    survey = (
        parse_survey_score(dialogue["survey_score"], source_name, record)
        if "survey_score" in dialogue
        else None
    )
    return Context(
        id=f"esconv:{split}:{index}",
        domain="emotional_support",
        source=SOURCE,
        split=split,
        valence="negative",
        history=messages[:cut],
        metadata={
            "dialogue_index": index,
            "emotion_type": dialogue["emotion_type"],
            "problem_type": dialogue["problem_type"],
            "experience_type": dialogue.get("experience_type"),
            "situation": str(dialogue["situation"]).strip(),
            "survey_score": survey,
            "reference_response": messages[cut].content if cut < len(messages) else None,
            "reference_strategy": annotations[cut].get("strategy") if cut < len(messages) else None,
            "turn_annotations": annotations[:cut],
            "n_turns": len(messages),
            "empty_turns_omitted": empty_turns,
            **{key: dialogue[key] for key in OPTIONAL_TEXT_KEYS if key in dialogue},
        },
    )
