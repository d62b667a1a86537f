"""Corpus loaders: the shipped samples load correctly, and every malformed input fails loudly."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from mascot.data import SAMPLES_DIR, SOURCES, Context, CorpusFormatError, load_contexts
from mascot.data.esconv import contexts_from_hub_rows
from mascot.data.qmsum import infer_meeting_type, window_bounds
from mascot.data.sampling import subsample
from mascot.data.valence import (
    ED_EMOTIONS,
    MIME_NEGATIVE,
    MIME_POSITIVE,
    NEGATIVE_EMOTIONS,
    NEUTRAL_EMOTIONS,
    POSITIVE_EMOTIONS,
    valence_of,
)

ED_DIR = SAMPLES_DIR / "empathetic_dialogues"
QMSUM_DIR = SAMPLES_DIR / "qmsum"
ESCONV_FILE = SAMPLES_DIR / "esconv" / "ESConv.json"
ED_HEADER = "conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags"


def assert_names(error: CorpusFormatError, path: Path | str, record: str, field: str | None) -> None:
    """The message names the file, the record and (where one applies) the field."""
    message = str(error)
    assert str(path) in message
    assert record in message, message
    if field is not None:
        assert f"'{field}'" in message, message
        assert error.field == field


# ---------------------------------------------------------------- valence table


def test_valence_table_partitions_the_32_emotions_as_mime_does():
    assert len(ED_EMOTIONS) == 32
    assert MIME_POSITIVE.isdisjoint(MIME_NEGATIVE) and len(MIME_POSITIVE | MIME_NEGATIVE) == 32
    assert (len(POSITIVE_EMOTIONS), len(NEGATIVE_EMOTIONS), len(NEUTRAL_EMOTIONS)) == (12, 16, 4)
    assert POSITIVE_EMOTIONS | NEGATIVE_EMOTIONS | NEUTRAL_EMOTIONS == set(ED_EMOTIONS)
    assert valence_of("Joyful") == "positive"
    assert valence_of("terrified") == "negative"
    assert valence_of("nostalgic") == "neutral"
    assert valence_of("hangry") is None


# ---------------------------------------------------------------- Empathetic Dialogues samples


def test_ed_samples_load_every_split_with_seeker_last():
    counts = {
        split: len(load_contexts("empathetic_dialogues", ED_DIR, split=split))
        for split in ("train", "valid", "test")
    }
    assert counts == {"train": 40, "valid": 10, "test": 10}
    train = load_contexts("empathetic_dialogues", ED_DIR)
    assert {c.metadata["emotion"] for c in train} == set(ED_EMOTIONS)
    for context in train:
        assert context.id == f"ed:train:{context.metadata['conv_id']}"
        assert context.domain == "emotional_support" and context.source == "empathetic_dialogues"
        assert context.split == "train"
        assert context.valence == valence_of(context.metadata["emotion"])
        assert context.history[0].role == "user" and context.history[-1].role == "user"
        roles = [m.role for m in context.history]
        assert all(a != b for a, b in itertools.pairwise(roles)), "ED turns alternate"
        assert len({m.name for m in context.history}) <= 2
        assert all("_comma_" not in m.content for m in context.history)
        assert "_comma_" not in context.metadata["situation"]
    assert any("," in m.content for c in train for m in c.history), "escaped commas are restored"
    with_reference = [c for c in train if c.metadata["reference_response"]]
    assert with_reference, "conversations ending on the listener keep that reply as the reference"


def test_ed_split_names_and_validation_file():
    for alias in ("valid", "val", "dev", "validation"):
        contexts = load_contexts("empathetic_dialogues", ED_DIR, split=alias)
        assert {c.split for c in contexts} == {"validation"}
        assert all(c.id.startswith("ed:validation:") for c in contexts)


def test_ed_release_csv_quirks_extra_fields_quotes_and_blank_lines(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text(
        "\n".join(
            [
                ED_HEADER,
                'hit:1_conv:2,1,sad,My cat is ill_comma_ sadly.,7,She won\'t eat "anything" today.,5|5|5_2|2|5,,extra,more',
                "hit:1_conv:2,2,sad,My cat is ill_comma_ sadly.,9,Oh no_comma_ I'm sorry.,5|5|5_2|2|5,",
                "hit:1_conv:2,3,sad,My cat is ill_comma_ sadly.,7,The vet sees her tomorrow.,5|5|5_2|2|5,",
                "hit:1_conv:2,4,sad,My cat is ill_comma_ sadly.,9,I hope she feels better soon.,5|5|5_2|2|5,",
                "",
                "",
            ]
        ),
        encoding="utf-8",
    )
    [context] = load_contexts("empathetic_dialogues", csv)
    assert [m.content for m in context.history] == [
        'She won\'t eat "anything" today.',
        "Oh no, I'm sorry.",
        "The vet sees her tomorrow.",
    ]
    assert [m.role for m in context.history] == ["user", "assistant", "user"]
    assert [m.name for m in context.history] == ["7", "9", "7"]
    assert context.metadata["situation"] == "My cat is ill, sadly."
    assert context.metadata["reference_response"] == "I hope she feels better soon."


def test_ed_csv_with_byte_order_mark(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text(
        "\ufeff" + ED_HEADER + "\nhit:2_conv:4,1,joyful,Good news.,1,We won!,,\n", encoding="utf-8"
    )
    [context] = load_contexts("empathetic_dialogues", csv)
    assert context.id == "ed:train:hit:2_conv:4"


def test_ed_rows_out_of_order_are_sorted_by_utterance_idx(tmp_path):
    csv = tmp_path / "train.csv"
    rows = [
        "hit:3_conv:6,2,content,Calm day.,5,Sounds lovely.,,",
        "hit:3_conv:6,1,content,Calm day.,4,Quiet tea at home.,,",
    ]
    csv.write_text("\n".join([ED_HEADER, *rows]) + "\n", encoding="utf-8")
    [context] = load_contexts("empathetic_dialogues", csv)
    assert [m.content for m in context.history] == ["Quiet tea at home."]
    assert context.metadata["reference_response"] == "Sounds lovely."


def _csv_as_conversation_rows() -> list[dict]:
    """The sample train CSV reshaped into the one-row-per-conversation parquet mirror layout."""
    contexts = load_contexts("empathetic_dialogues", ED_DIR)
    return [
        {
            "conv_id": c.metadata["conv_id"],
            "situation": c.metadata["situation"],
            "emotion": c.metadata["emotion"],
            "conversations": [{"content": m.content, "role": m.role} for m in c.history],
        }
        for c in contexts
    ]


def test_ed_parquet_mirror_directory_layout_matches_csv(tmp_path):
    rows = _csv_as_conversation_rows()
    (tmp_path / "data").mkdir()
    pl.DataFrame(rows).write_parquet(tmp_path / "data" / "train-00000-of-00001.parquet")
    pl.DataFrame(rows[:3]).write_parquet(tmp_path / "data" / "valid-00000-of-00001.parquet")
    from_parquet = load_contexts("empathetic_dialogues", tmp_path)
    from_csv = load_contexts("empathetic_dialogues", ED_DIR)
    assert [c.id for c in from_parquet] == [c.id for c in from_csv]
    assert [[m.content for m in c.history] for c in from_parquet] == [
        [m.content for m in c.history] for c in from_csv
    ]
    assert [c.valence for c in from_parquet] == [c.valence for c in from_csv]
    assert len(load_contexts("empathetic_dialogues", tmp_path, split="validation")) == 3


def test_ed_parquet_mirror_with_context_and_prompt_columns(tmp_path):
    file = tmp_path / "mirror.parquet"
    pl.DataFrame(
        [
            {
                "conv_id": "hit:9_conv:18",
                "context": "excited",
                "prompt": "New bike_comma_ finally.",
                "conversations": [
                    {"role": "user", "content": "I bought a new bike today!"},
                    {"role": "assistant", "content": "Nice! What kind?"},
                    {"role": "user", "content": "A green road bike."},
                    {"role": "assistant", "content": "Enjoy the first ride!"},
                ],
            }
        ]
    ).write_parquet(file)
    [context] = load_contexts("empathetic_dialogues", file, split="test")
    assert context.id == "ed:test:hit:9_conv:18" and context.valence == "positive"
    assert context.metadata["situation"] == "New bike, finally."
    assert context.history[-1].content == "A green road bike."
    assert context.metadata["reference_response"] == "Enjoy the first ride!"


def test_ed_parquet_with_release_columns(tmp_path):
    file = tmp_path / "train.parquet"
    pl.DataFrame(
        {
            "conv_id": ["hit:5_conv:10"] * 2,
            "utterance_idx": [1, 2],
            "context": ["grateful"] * 2,
            "prompt": ["A kind stranger."] * 2,
            "speaker_idx": [11, 12],
            "utterance": ["Someone returned my wallet_comma_ cash and all.", "How lucky!"],
            "selfeval": ["5|5|5_5|5|5"] * 2,
            "tags": [""] * 2,
        }
    ).write_parquet(file)
    [context] = load_contexts("empathetic_dialogues", file)
    assert context.history[0].content == "Someone returned my wallet, cash and all."
    assert context.history[0].name == "11"


# ---------------------------------------------------------------- Empathetic Dialogues malformed


def _write_ed(tmp_path: Path, *lines: str, header: str = ED_HEADER) -> Path:
    path = tmp_path / "train.csv"
    path.write_text("\n".join([header, *lines]) + "\n", encoding="utf-8")
    return path


GOOD_ROW = "hit:1_conv:2,1,sad,Situation.,1,Hello there.,,"


def test_ed_missing_header_column(tmp_path):
    path = _write_ed(
        tmp_path,
        "hit:1_conv:2,1,sad,Situation.,1,,",
        header="conv_id,utterance_idx,context,prompt,speaker_idx,selfeval,tags",
    )
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", path)
    assert_names(excinfo.value, path, "line 1 (header)", "utterance")


def test_ed_row_with_too_few_fields(tmp_path):
    path = _write_ed(tmp_path, GOOD_ROW, "hit:1_conv:2,2,sad,Situation.,2")
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", path)
    assert_names(excinfo.value, path, "line 3", "utterance")
    assert "5 fields" in str(excinfo.value)


def test_ed_unknown_emotion(tmp_path):
    path = _write_ed(tmp_path, "hit:1_conv:2,1,hangry,Situation.,1,Hello there.,,")
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", path)
    assert_names(excinfo.value, path, "conv_id hit:1_conv:2", "context")
    assert "hangry" in str(excinfo.value)


def test_ed_conversation_with_more_than_two_speakers(tmp_path):
    path = _write_ed(
        tmp_path,
        GOOD_ROW,
        "hit:1_conv:2,2,sad,Situation.,2,Hi.,,",
        "hit:1_conv:2,3,sad,Situation.,3,Who are you?,,",
    )
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", path)
    assert_names(excinfo.value, path, "conv_id hit:1_conv:2", "speaker_idx")


def test_ed_empty_dialogue(tmp_path):
    path = _write_ed(tmp_path, "hit:1_conv:2,1,sad,Situation.,1,   ,,")
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", path)
    assert_names(excinfo.value, path, "line 2", "utterance")


def test_ed_non_integer_utterance_idx(tmp_path):
    path = _write_ed(tmp_path, "hit:1_conv:2,first,sad,Situation.,1,Hello.,,")
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", path)
    assert_names(excinfo.value, path, "line 2", "utterance_idx")


def test_ed_mirror_missing_emotion_column(tmp_path):
    file = tmp_path / "m.parquet"
    pl.DataFrame([{"conv_id": "c1", "conversations": [{"role": "user", "content": "Hi"}]}]).write_parquet(
        file
    )
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", file)
    assert_names(excinfo.value, file, "row 0", "context")


def test_ed_mirror_unknown_role(tmp_path):
    file = tmp_path / "m.parquet"
    turns = [{"role": "user", "content": "Hi"}, {"role": "narrator", "content": "Meanwhile..."}]
    pl.DataFrame([{"conv_id": "c1", "emotion": "sad", "conversations": turns}]).write_parquet(file)
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", file)
    assert_names(excinfo.value, file, "row 0", "conversations[1].role")


def test_ed_mirror_empty_conversation(tmp_path):
    file = tmp_path / "m.parquet"
    frame = pl.DataFrame(
        {"conv_id": ["c1"], "emotion": ["sad"], "conversations": [[]]},
        schema={
            "conv_id": pl.String,
            "emotion": pl.String,
            "conversations": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
        },
    )
    frame.write_parquet(file)
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", file)
    assert_names(excinfo.value, file, "row 0", "conversations")


def test_ed_table_without_known_columns(tmp_path):
    file = tmp_path / "m.parquet"
    pl.DataFrame({"text": ["hello"]}).write_parquet(file)
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("empathetic_dialogues", file)
    assert_names(excinfo.value, file, "row 0", "conversations")


# ---------------------------------------------------------------- QMSum samples


def test_qmsum_samples_windows_are_bounded_and_cover_each_meeting():
    contexts = load_contexts("qmsum", QMSUM_DIR, window_turns=12)
    assert {c.meeting_type for c in contexts} == {"Academic", "Product", "Committee"}
    by_meeting: dict[str, list[Context]] = {}
    for context in contexts:
        assert context.domain == "meetings" and context.source == "qmsum" and context.split == "train"
        assert context.valence is None
        assert 1 <= len(context.history) <= 12
        assert all(m.role == "user" and m.name for m in context.history)
        assert context.metadata["meeting_type_source"] == "folder"
        start, end = context.metadata["turn_range"]
        assert end - start + 1 <= 12
        for item in context.metadata["topics"] + context.metadata["specific_queries"]:
            assert all(start <= s <= e <= end for s, e in item["spans"])
        assert context.metadata["general_queries"]
        by_meeting.setdefault(context.metadata["meeting_id"], []).append(context)
    assert len(by_meeting) == 3
    for windows in by_meeting.values():
        assert len(windows) >= 3, "30+ turn meetings give several windows"
        covered = [
            t for w in windows for t in range(w.metadata["turn_range"][0], w.metadata["turn_range"][1] + 1)
        ]
        assert covered == list(range(windows[0].metadata["n_meeting_turns"]))
        assert [w.id for w in windows] == [
            f"qmsum:train:{w.metadata['meeting_id']}#w{k}" for k, w in enumerate(windows)
        ]
    assert any(c.metadata["specific_queries"] for c in contexts)
    assert str(SAMPLES_DIR) not in json.dumps([c.metadata for c in contexts]), "no machine paths in metadata"


def test_qmsum_ids_are_stable_and_splits_load():
    first = load_contexts("qmsum", QMSUM_DIR)
    second = load_contexts("qmsum", QMSUM_DIR)
    assert [c.model_dump() for c in first] == [c.model_dump() for c in second]
    for split, expected in (("val", "validation"), ("test", "test")):
        contexts = load_contexts("qmsum", QMSUM_DIR, split=split)
        assert {c.meeting_type for c in contexts} == {"Academic", "Product", "Committee"}
        assert {c.split for c in contexts} == {expected}


def test_qmsum_overlapping_windows_with_stride():
    contexts = load_contexts(
        "qmsum", QMSUM_DIR / "Product" / "jsonl" / "train.jsonl", window_turns=10, window_stride=5
    )
    ranges = [c.metadata["turn_range"] for c in contexts]
    assert ranges[0] == [0, 9] and ranges[1] == [5, 14]
    assert ranges[-1][1] == contexts[0].metadata["n_meeting_turns"] - 1
    assert all(end - start + 1 <= 10 for start, end in ranges)


def test_qmsum_all_layout_infers_the_same_meeting_types(tmp_path):
    all_dir = tmp_path / "data" / "ALL" / "jsonl"
    all_dir.mkdir(parents=True)
    lines = "".join(
        (QMSUM_DIR / d / "jsonl" / "train.jsonl").read_text() for d in ("Academic", "Product", "Committee")
    )
    (all_dir / "train.jsonl").write_text(lines)
    from_all = load_contexts("qmsum", tmp_path)
    from_domains = load_contexts("qmsum", QMSUM_DIR)
    assert sorted((c.id, c.meeting_type) for c in from_all) == sorted(
        (c.id, c.meeting_type) for c in from_domains
    )
    assert {c.metadata["meeting_type_source"] for c in from_all} == {"speakers"}


def test_qmsum_meeting_type_inference_rule():
    assert infer_meeting_type(["Project Manager", "Marketing"]) == "Product"
    assert infer_meeting_type(["Professor D", "PhD A", "Grad C"]) == "Academic"
    assert infer_meeting_type(["The Chair", "Hon. Someone"]) == "Committee"


def test_window_bounds():
    assert window_bounds(5, 16, 16) == [(0, 4)]
    assert window_bounds(10, 4, 4) == [(0, 3), (4, 7), (8, 9)]
    assert window_bounds(10, 4, 2) == [(0, 3), (2, 5), (4, 7), (6, 9)]
    assert window_bounds(8, 4, 4) == [(0, 3), (4, 7)]


def _meeting(**overrides) -> dict:
    meeting = {
        "topic_list": [{"topic": "Budget", "relevant_text_span": [["0", "2"]]}],
        "general_query_list": [{"query": "Summarize the meeting.", "answer": "They talked."}],
        "specific_query_list": [
            {"query": "What about the budget?", "answer": "Approved.", "relevant_text_span": [["1", "2"]]}
        ],
        "meeting_transcripts": [
            {"speaker": "The Chair", "content": "We begin."},
            {"speaker": "Councillor A", "content": ""},
            {"speaker": "Councillor B", "content": "Agreed."},
        ],
    }
    meeting.update(overrides)
    return meeting


def _write_jsonl(tmp_path: Path, *meetings: dict | str) -> Path:
    path = tmp_path / "Committee" / "jsonl" / "train.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in meetings))
    return path


def test_qmsum_empty_content_turns_are_omitted_and_counted(tmp_path):
    path = _write_jsonl(tmp_path, _meeting())
    [context] = load_contexts("qmsum", path)
    assert [m.content for m in context.history] == ["We begin.", "Agreed."]
    assert context.metadata["empty_turns_omitted"] == 1
    assert context.metadata["turn_range"] == [0, 2]
    assert context.meeting_type == "Committee"
    assert context.metadata["specific_queries"] == [
        {"query": "What about the budget?", "answer": "Approved.", "spans": [[1, 2]]}
    ]


# ---------------------------------------------------------------- QMSum malformed


@pytest.mark.parametrize(
    "key", ["meeting_transcripts", "topic_list", "general_query_list", "specific_query_list"]
)
def test_qmsum_missing_key(tmp_path, key):
    meeting = _meeting()
    del meeting[key]
    path = _write_jsonl(tmp_path, _meeting(), meeting)
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("qmsum", path)
    assert_names(excinfo.value, path, "line 2", key)


def test_qmsum_missing_nested_key(tmp_path):
    path = _write_jsonl(tmp_path, _meeting(specific_query_list=[{"query": "Q?", "answer": "A."}]))
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("qmsum", path)
    assert_names(excinfo.value, path, "line 1", "specific_query_list[0].relevant_text_span")


def test_qmsum_bad_json_names_the_line(tmp_path):
    path = _write_jsonl(tmp_path, _meeting(), '{"topic_list": [', _meeting())
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("qmsum", path)
    assert_names(excinfo.value, path, "line 2", None)
    assert "invalid JSON" in str(excinfo.value)


@pytest.mark.parametrize(
    "turn", [{"speaker": "", "content": "Hi."}, {"content": "Hi."}, {"speaker": None, "content": "Hi."}]
)
def test_qmsum_empty_or_missing_speaker(tmp_path, turn):
    path = _write_jsonl(
        tmp_path, _meeting(meeting_transcripts=[{"speaker": "The Chair", "content": "We begin."}, turn])
    )
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("qmsum", path)
    assert_names(excinfo.value, path, "line 1", "meeting_transcripts[1].speaker")


def test_qmsum_empty_meeting(tmp_path):
    path = _write_jsonl(tmp_path, _meeting(meeting_transcripts=[], topic_list=[], specific_query_list=[]))
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("qmsum", path)
    assert_names(excinfo.value, path, "line 1", "meeting_transcripts")


@pytest.mark.parametrize(
    ("span", "problem"),
    [
        (["a", "2"], "not a non-negative integer"),
        (["1.5", "2"], "not a non-negative integer"),
        (["2", "1"], "start 2 > end 1"),
        (["0", "3"], "runs past the last turn"),
        (["0"], "expected a [start, end] pair"),
    ],
)
def test_qmsum_bad_span(tmp_path, span, problem):
    topics = [{"topic": "Budget", "relevant_text_span": [["0", "1"], span]}]
    path = _write_jsonl(tmp_path, _meeting(topic_list=topics))
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("qmsum", path)
    assert_names(excinfo.value, path, "line 1", "topic_list[0].relevant_text_span[1]")
    assert problem in str(excinfo.value)


# ---------------------------------------------------------------- ESConv


def test_esconv_sample_loads_whole_file_as_test_split():
    contexts = load_contexts("esconv", ESCONV_FILE)
    assert len(contexts) == 12
    assert load_contexts("esconv", ESCONV_FILE.parent) == contexts
    for index, context in enumerate(contexts):
        assert context.id == f"esconv:test:{index}"
        assert context.split == "test" and context.valence == "negative"
        assert context.domain == "emotional_support" and context.source == "esconv"
        assert context.history[-1].role == "user"
        assert {m.name for m in context.history} <= {"seeker", "supporter"}
        assert all((m.role == "user") == (m.name == "seeker") for m in context.history)
        assert len(context.metadata["turn_annotations"]) == len(context.history)
        seeker_scores = context.metadata["survey_score"]["seeker"]
        assert all(isinstance(v, int) for v in seeker_scores.values())
    assert contexts[0].metadata["survey_score"]["seeker"]["initial_emotion_intensity"] == 5
    with_reference = [c for c in contexts if c.metadata["reference_response"]]
    assert with_reference and all(c.metadata["reference_strategy"] for c in with_reference)
    assert [c.split for c in load_contexts("esconv", ESCONV_FILE, split="train")] == ["train"] * 12


def _esconv_dialogue(**overrides) -> dict:
    dialogue = {
        "experience_type": "Current Experience",
        "emotion_type": "anxiety",
        "problem_type": "job crisis",
        "situation": "Worried about work.",
        "survey_score": {
            "seeker": {"initial_emotion_intensity": "4", "final_emotion_intensity": "2"},
            "supporter": {},
        },
        "dialog": [
            {"speaker": "supporter", "annotation": {"strategy": "Question"}, "content": "Hi, how are you?"},
            {"speaker": "seeker", "annotation": {}, "content": "Worried about my job."},
            {
                "speaker": "supporter",
                "annotation": {"strategy": "Reflection of feelings"},
                "content": "That sounds hard.",
            },
        ],
    }
    dialogue.update(overrides)
    return dialogue


def _write_esconv(tmp_path: Path, *dialogues: dict) -> Path:
    path = tmp_path / "ESConv.json"
    path.write_text(json.dumps(list(dialogues)))
    return path


def test_esconv_cut_after_last_seeker_turn_and_drop_counted(tmp_path, caplog):
    supporter_only = _esconv_dialogue(
        dialog=[{"speaker": "supporter", "annotation": {}, "content": "Hello?"}]
    )
    path = _write_esconv(tmp_path, _esconv_dialogue(), supporter_only)
    with caplog.at_level(logging.WARNING):
        contexts = load_contexts("esconv", path)
    assert [c.id for c in contexts] == ["esconv:test:0"]
    assert [m.content for m in contexts[0].history] == ["Hi, how are you?", "Worried about my job."]
    assert contexts[0].metadata["reference_response"] == "That sounds hard."
    assert contexts[0].metadata["reference_strategy"] == "Reflection of feelings"
    assert contexts[0].metadata["survey_score"] == {
        "seeker": {"initial_emotion_intensity": 4, "final_emotion_intensity": 2},
        "supporter": {},
    }
    assert "dropped 1 dialogue" in caplog.text


def test_esconv_hub_processed_rows():
    processed = {
        "emotion_type": "sadness",
        "problem_type": "breakup with partner",
        "situation": "Breakup.",
        "dialog": [
            {"text": "I feel low.", "speaker": "usr"},
            {"text": "I'm sorry to hear that.", "speaker": "sys", "strategy": "Reflection of feelings"},
        ],
    }
    [context] = contexts_from_hub_rows(
        [{"text": json.dumps(processed)}], source_name="hf://x", split="validation"
    )
    assert context.history[0].role == "user" and context.metadata["survey_score"] is None
    assert context.metadata["reference_strategy"] == "Reflection of feelings"


@pytest.mark.parametrize(
    "key", ["experience_type", "emotion_type", "problem_type", "situation", "survey_score", "dialog"]
)
def test_esconv_missing_key(tmp_path, key):
    broken = _esconv_dialogue()
    del broken[key]
    path = _write_esconv(tmp_path, _esconv_dialogue(), broken)
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("esconv", path)
    assert_names(excinfo.value, path, "dialogue 1", key)


def test_esconv_bad_json_names_the_position(tmp_path):
    path = tmp_path / "ESConv.json"
    path.write_text('[\n {"emotion_type": "anxiety",\n  "dialog": [}\n]')
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("esconv", path)
    assert_names(excinfo.value, path, "line 3, column", None)
    assert "invalid JSON" in str(excinfo.value)


def test_esconv_unknown_speaker(tmp_path):
    dialog = [
        {"speaker": "seeker", "annotation": {}, "content": "Hi."},
        {"speaker": "listener", "annotation": {}, "content": "Hey."},
    ]
    path = _write_esconv(tmp_path, _esconv_dialogue(dialog=dialog))
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("esconv", path)
    assert_names(excinfo.value, path, "dialogue 0", "dialog[1].speaker")


@pytest.mark.parametrize("dialog", [[], [{"speaker": "seeker", "annotation": {}, "content": "  "}]])
def test_esconv_empty_dialogue(tmp_path, dialog):
    path = _write_esconv(tmp_path, _esconv_dialogue(dialog=dialog))
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("esconv", path)
    assert_names(excinfo.value, path, "dialogue 0", "dialog")


@pytest.mark.parametrize("value", ["five", "", "4.5", None])
def test_esconv_non_numeric_survey_score(tmp_path, value):
    scores = {"seeker": {"initial_emotion_intensity": "4", "empathy": value}, "supporter": {}}
    path = _write_esconv(tmp_path, _esconv_dialogue(survey_score=scores))
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("esconv", path)
    assert_names(excinfo.value, path, "dialogue 0", "survey_score.seeker.empathy")


def test_esconv_top_level_must_be_a_list(tmp_path):
    path = tmp_path / "ESConv.json"
    path.write_text(json.dumps(_esconv_dialogue()))
    with pytest.raises(CorpusFormatError) as excinfo:
        load_contexts("esconv", path)
    assert_names(excinfo.value, path, "top level", None)


# ---------------------------------------------------------------- subsampling and the entry point


def test_subsampling_is_reproducible_and_seed_dependent():
    everything = load_contexts("empathetic_dialogues", ED_DIR)
    first = load_contexts("empathetic_dialogues", ED_DIR, limit=10, seed=3)
    again = load_contexts("empathetic_dialogues", ED_DIR, limit=10, seed=3)
    other = load_contexts("empathetic_dialogues", ED_DIR, limit=10, seed=4)
    assert [c.id for c in first] == [c.id for c in again]
    assert len(first) == 10 and {c.id for c in first} != {c.id for c in other}
    order = [c.id for c in everything]
    assert [c.id for c in first] == sorted((c.id for c in first), key=order.index), "corpus order is kept"
    larger = load_contexts("empathetic_dialogues", ED_DIR, limit=20, seed=3)
    assert {c.id for c in first} <= {c.id for c in larger}, "a larger limit extends a smaller one"
    assert load_contexts("empathetic_dialogues", ED_DIR, limit=1000, seed=3) == everything
    assert load_contexts("empathetic_dialogues", ED_DIR, limit=0) == []


def test_subsampling_does_not_depend_on_python_hash_randomisation():
    code = (
        "from mascot.data import load_contexts, SAMPLES_DIR;"
        "print(' '.join(c.id for c in load_contexts('qmsum', SAMPLES_DIR / 'qmsum', limit=4, seed=7)))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    in_process = [c.id for c in load_contexts("qmsum", QMSUM_DIR, limit=4, seed=7)]
    assert outputs.pop().split() == in_process


def test_subsample_rejects_negative_limit():
    with pytest.raises(ValueError, match="limit"):
        subsample([], -1)


def test_entry_point_argument_errors(tmp_path):
    with pytest.raises(ValueError) as excinfo:
        load_contexts("dailydialog", ED_DIR)
    assert all(source in str(excinfo.value) for source in SOURCES)
    with pytest.raises(ValueError, match="exactly one"):
        load_contexts("esconv")
    with pytest.raises(ValueError, match="exactly one"):
        load_contexts("esconv", ESCONV_FILE, hub_name="thu-coai/esconv")
    with pytest.raises(ValueError, match="unknown split"):
        load_contexts("esconv", ESCONV_FILE, split="holdout")
    with pytest.raises(ValueError, match="window_turns"):
        load_contexts("qmsum", QMSUM_DIR, window_turns=0)
    with pytest.raises(FileNotFoundError):
        load_contexts("esconv", tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("source", "expected"),
    [("empathetic_dialogues", "valid.csv"), ("qmsum", "val.jsonl"), ("esconv", "ESConv.json")],
)
def test_directory_without_the_split_file_lists_what_was_looked_for(tmp_path, source, expected):
    with pytest.raises(FileNotFoundError) as excinfo:
        load_contexts(source, tmp_path, split="validation")
    assert expected in str(excinfo.value) and str(tmp_path) in str(excinfo.value)


def test_hub_unreachable_gives_a_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError) as excinfo:
        load_contexts("empathetic_dialogues", hub_name="someone/empathetic_dialogues", split="validation")
    message = str(excinfo.value)
    assert "unreachable" in message and "path=" in message
    assert "'validation'" in message and "'valid'" in message, "every split name tried is listed"


def test_hub_rows_use_the_same_parsers(monkeypatch):
    import datasets

    rows = _csv_as_conversation_rows()
    calls = []

    def fake_load_dataset(name, split, revision="main"):
        calls.append((split, revision))
        if split != "valid":
            raise ValueError(f"Unknown split {split!r}")
        return rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    contexts = load_contexts("empathetic_dialogues", hub_name="someone/ed_llm", split="validation", limit=5)
    # The hub's parquet conversion, which datasets >= 4 reads even where the main branch is a loading script.
    assert calls == [("validation", "refs/convert/parquet"), ("valid", "refs/convert/parquet")]
    assert len(contexts) == 5 and all(c.split == "validation" for c in contexts)
