"""The unit of independence: QMSum meetings are held out whole, an evaluation context that shares a meeting
with training is refused, intervals and paired comparisons resample meetings, and the report says only what
eval/contexts.parquet counted."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from test_cli import REPO

from mascot.artifacts import write_parquet
from mascot.config import DataConfig
from mascot.data.contexts import held_out_contexts, write_contexts
from mascot.evaluation.conversations import write_eval_contexts
from mascot.evaluation.report import independence_line
from mascot.evaluation.results import evaluation_results, independence
from mascot.evaluation.scoring import SCORE_SCHEMA

QMSUM = {"source": "qmsum", "path": "samples:qmsum", "window_turns": 4}


def meetings_data(**held_out) -> DataConfig:
    return DataConfig.model_validate({
        "domain": "meetings", "roster": REPO / "configs" / "rosters" / "meetings.yaml", "held_out_fraction": 0.25,
        "corpus": {**QMSUM, "split": "train"}, "held_out": [{**QMSUM, "split": "validation", **held_out}]})


def test_a_meeting_is_held_out_whole_and_the_share_is_of_meetings(tmp_path):
    frame = write_contexts(meetings_data(), 0, tmp_path / "contexts.parquet").read_parquet()
    meeting = frame["metadata"].map_elements(lambda m: json.loads(m)["meeting_id"], return_dtype=pl.String)
    assert frame["cluster"].to_list() == [f"qmsum:{m}" for m in meeting]
    sides = frame.group_by("cluster").agg(pl.col("held_out").n_unique().alias("sides"), pl.col("held_out").first())
    assert sides["sides"].to_list() == [1, 1, 1], "every meeting's windows lie on one side"
    assert sides["held_out"].sum() == 1, "a quarter of 3 meetings, rounded up: one meeting"
    # Without clusters each context is its own, as for Empathetic Dialogues: the split is what it always was.
    ids = [f"ed:train:{i}" for i in range(20)]
    assert held_out_contexts(ids, 0.25, 0, {i: i for i in ids}) == held_out_contexts(ids, 0.25, 0)
    # Two clusters of ten contexts: one whole cluster is held out, never a part of one.
    clusters = {i: "a" if int(i.rsplit(":", 1)[1]) < 10 else "b" for i in ids}
    held = held_out_contexts(ids, 0.25, 0, clusters)
    assert len(held) == 10 and len({clusters[i] for i in held}) == 1


def test_the_evaluation_contexts_carry_their_meeting_and_a_planted_shared_meeting_is_refused(tmp_path):
    data = meetings_data()
    stage1 = write_contexts(data, 0, tmp_path / "contexts.parquet")
    written = write_eval_contexts(data, stage1, 0, True, tmp_path / "eval_contexts.parquet").read_parquet()
    assert written["training_contexts_in_cluster"].to_list() == [0] * written.height
    assert written.filter(pl.col("eval_set") == "held_out")["cluster"].n_unique() == 1
    assert written.filter(pl.col("eval_set") == "qmsum:validation")["cluster"].n_unique() == 3

    # Plant a leak: one window of a training meeting marked held out, the way a split by window would.
    frame = stage1.read_parquet()
    training_meeting = frame.filter(~pl.col("held_out"))["cluster"][0]
    planted_id = frame.filter(pl.col("cluster") == training_meeting)["context_id"][0]
    leaky = write_parquet(frame.with_columns(held_out=pl.col("held_out") | (pl.col("context_id") == planted_id)),
                          tmp_path / "leaky.parquet")
    with pytest.raises(ValueError, match=f"1 evaluation context\\(s\\) share their cluster .* {planted_id} "
                                         f"\\(held_out\\) is in cluster {training_meeting} with training context"):
        write_eval_contexts(data, leaky, 0, True, tmp_path / "refused.parquet")
    assert not (tmp_path / "refused.parquet").exists()

    # A held-out corpus whose validation split holds the training split's meetings (copied there) is refused too.
    samples = REPO / "mascot" / "data" / "samples" / "qmsum"
    for train in samples.glob("*/jsonl/train.jsonl"):
        copy = tmp_path / "copied" / train.relative_to(samples).with_name("val.jsonl")
        copy.parent.mkdir(parents=True)
        copy.write_bytes(train.read_bytes())
    with pytest.raises(ValueError, match=r"\(qmsum:validation\) is in cluster qmsum:"):
        write_eval_contexts(meetings_data(path=str(tmp_path / "copied")), stage1, 0, True,
                            tmp_path / "refused.parquet")


def scores(differences: dict[str, float]) -> pl.DataFrame:
    rows = []
    for context, difference in differences.items():
        for system, value in (("mascot", 50.0 + difference), ("zero_shot", 50.0)):
            rows.append({"system": system, "context_id": context, "seed": 0, "level": "persona", "metric": "overall",
                         "judge": "j", "value": value})
    return pl.DataFrame(rows, schema=SCORE_SCHEMA)


def test_intervals_and_comparisons_resample_meetings_not_windows():
    # Meeting A: three windows, MASCOT 10 ahead in each; meeting B: one window, no difference.
    differences = {"a1": 10.0, "a2": 10.0, "a3": 10.0, "b1": 0.0}
    contexts = pl.DataFrame({"context_id": list(differences), "eval_set": ["held_out"] * 4,
                             "cluster": ["A", "A", "A", "B"]})
    results = evaluation_results(scores(differences), contexts, ["mascot", "zero_shot"], resamples=400)
    [comparison] = results["held_out"]["comparisons"]
    # Per meeting: +10 and 0, so +5 (per window it would be +7.5); resampling the two meetings gives means of
    # 10, 5 and 0, so the interval is [0, 10] (over windows it would be far narrower).
    assert comparison["mean"] == pytest.approx(5.0) and (comparison["clusters"], comparison["contexts"]) == (2, 4)
    assert (comparison["ci_low"], comparison["ci_high"]) == (0.0, 10.0)
    mascot = next(e for e in results["held_out"]["summaries"] if e["system"] == "mascot")
    assert (mascot["contexts"], mascot["clusters"], mascot["mean"]) == (4, 2, pytest.approx(57.5))
    assert mascot["ci_low"] == pytest.approx(50.0) and mascot["ci_high"] == pytest.approx(60.0)
    # An older eval/contexts.parquet without the column: each context is its own cluster.
    unclustered = evaluation_results(scores(differences), contexts.drop("cluster"), ["mascot", "zero_shot"],
                                     resamples=400)
    assert unclustered["held_out"]["comparisons"][0]["mean"] == pytest.approx(7.5)


def test_the_report_says_what_was_counted_and_nothing_else():
    contexts = pl.DataFrame({"context_id": ["a1", "a2", "b1", "e1"], "eval_set": ["held_out"] * 3 + ["esconv:test"],
                             "cluster": ["A", "A", "B", "e1"], "training_contexts_in_cluster": [0, 0, 0, 0]})
    line = independence_line(independence(contexts))
    assert line == ("Clusters (held_out: 3 contexts in 2 clusters, esconv:test: 1 context in 1 cluster); counted in "
                    "eval/contexts.parquet, none shares a cluster (a meeting or a conversation) with any context a "
                    "training step read.")
    leaked = independence(contexts.with_columns(training_contexts_in_cluster=pl.Series([0, 0, 2, 0])))
    assert "**1 share a cluster with contexts a training step read**" in independence_line(leaked)
    old = independence_line(independence(contexts.drop("training_contexts_in_cluster")))
    assert "was not counted for this run" in old and "none shares" not in old


def test_a_stage1_contexts_file_from_before_the_cluster_column_gets_it_from_the_metadata(tmp_path):
    data = meetings_data()
    stage1 = write_contexts(data, 0, tmp_path / "contexts.parquet")
    old = write_parquet(stage1.read_parquet().drop("cluster"), tmp_path / "old.parquet")
    again = write_eval_contexts(data, old, 0, False, tmp_path / "eval.parquet").read_parquet()
    assert again["cluster"].to_list() == stage1.read_parquet().filter(pl.col("held_out"))["cluster"].to_list()




def test_the_minimum_detectable_effect_counts_meetings_not_windows():
    from mascot.evaluation.results import adjust_across_report
    from mascot.evaluation.statistics import minimum_detectable_effect

    differences = {"a1": 10.0, "a2": 10.0, "a3": 0.0, "b1": 0.0, "b2": 10.0, "c1": 0.0}
    contexts = pl.DataFrame({"context_id": list(differences), "eval_set": ["held_out"] * 6,
                             "cluster": ["A", "A", "A", "B", "B", "C"]})
    results = evaluation_results(scores(differences), contexts, ["mascot", "zero_shot"], resamples=100)
    assert adjust_across_report(results, {}) == 2  # "all" and "held_out"
    [comparison] = results["held_out"]["comparisons"]
    # Per meeting: 20/3, 5 and 0; their sd over 3 meetings, at Holm's first step 0.05 / 2.
    sd = float(np.std([20 / 3, 5.0, 0.0], ddof=1))
    assert comparison["sd"] == pytest.approx(sd)
    assert comparison["mde"] == pytest.approx(minimum_detectable_effect(sd, 3, 0.025))
    assert comparison["mde"] != pytest.approx(minimum_detectable_effect(sd, 6, 0.025))
