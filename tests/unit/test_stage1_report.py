"""The Stage 1 report's training sections, including the cases with nothing to report."""

from __future__ import annotations

from mascot.config import BeforeAfterConfig
from mascot.stage1.report import (
    accuracy_lines,
    before_after_markdown,
    before_after_rows,
    reward_model_markdown,
    speaker_markdown,
)
from mascot.stats import clustered_mean, describe, histogram, paired_difference, proportion


def reward_model_metrics(held_out_n: int) -> dict:
    accuracy = proportion(held_out_n // 2, held_out_n)
    margins = [0.1 * i for i in range(held_out_n)]
    clustered = clustered_mean([float(i % 2) for i in range(held_out_n)], [f"c{i % 4}" for i in range(held_out_n)])
    return {"held_out": {"accuracy": accuracy, "accuracy_by_context": clustered, "by_persona": {"anchor": accuracy} if held_out_n else {},
                         "margin": describe(margins), "margin_histogram": histogram(margins) if margins else {}},
            "train": {"accuracy": proportion(9, 10)},
            "training": {"steps": 4, "train_pairs": 10, "held_out_pairs": held_out_n, "held_out_contexts": ["c1"]}}


def test_reward_model_section_gives_every_accuracy_its_interval_and_n():
    text = "\n".join(reward_model_markdown(reward_model_metrics(8)))
    assert "Held-out pair accuracy: 50.0% [" in text and "(n=8 from 4 clusters)" in text
    assert "over pairs, as if they were independent: 50.0% [" in text and "| anchor | 50.0% [" in text
    assert "Training-pair accuracy: 90.0% [" in text and "(n=10)" in text and "sample" not in text


def test_a_sampled_training_pair_accuracy_says_how_many_pairs_of_how_many():
    metrics = reward_model_metrics(8)
    metrics["train"].update(pairs_scored=10, pairs=10)
    assert "sample" not in "\n".join(reward_model_markdown(metrics)), "every training pair scored: no sample to name"
    metrics["train"].update(pairs=250)
    text = "\n".join(reward_model_markdown(metrics))
    assert "Training-pair accuracy: 90.0% [" in text and "on a seeded sample of 10 of the 250 training pairs" in text


def test_pairs_dropped_for_their_length_are_counted_in_the_report():
    metrics = reward_model_metrics(8)
    metrics["training"].update(train_pairs_within_max_length=10, max_length=1024)
    assert "max_length" not in "\n".join(reward_model_markdown(metrics)), "none dropped: nothing to say"
    metrics["training"].update(train_pairs_within_max_length=7)
    text = "\n".join(reward_model_markdown(metrics))
    assert ("**3 of the 10 training pairs (30.0%) were longer than max_length (1024 tokens) and left out: the model "
            "learned from 7.**") in text
    del metrics["training"]["max_length"]  # a run from before max_length was recorded
    assert "were longer than max_length and left out" in "\n".join(reward_model_markdown(metrics))


def test_no_held_out_pairs_reads_as_not_available_rather_than_zero():
    text = "\n".join(reward_model_markdown(reward_model_metrics(0)))
    assert "Held-out pair accuracy: n/a (n=0)" in text and "reward margin" not in text


def test_speaker_section_reports_parameters_and_smoothed_reward():
    history = [{"step": i, "reward": float(i)} for i in range(1, 21)]
    metrics = {"trainable_parameters": {"trainable": 7168, "total": 236928, "fraction": 7168 / 236928},
               "training": {"steps": 20, "prompts": 54, "resumed_from_step": 5}, "log_history": history}
    text = "\n".join(speaker_markdown(metrics))
    assert "7,168 of 236,928 parameters trainable (3.025%)" in text and "resumed from step 5" in text
    assert "steps 1-2: 1.500" in text and "steps 19-20: 19.500" in text


def test_before_after_table_has_n_means_and_intervals_and_survives_an_empty_score():
    difference = paired_difference([1.0, 2.0, 3.0], [1.5, 2.1, 3.9], resamples=200)
    by_context = clustered_mean([0.5, 0.1, 0.9], ["c1", "c1", "c2"], resamples=200)
    empty = {"base": describe([]), "speaker": describe([]), "difference": paired_difference([], []),
             "difference_by_context": clustered_mean([], [])}
    metrics = {"prompts": 3, "samples_per_prompt": BeforeAfterConfig().samples_per_prompt, "judge_failures": 3,
               "scores": {"persona_rm": {"base": describe([1.0, 2.0, 3.0]), "speaker": describe([1.5, 2.1, 3.9]),
                                         "difference": difference, "difference_by_context": by_context},
                          "judge": empty}}
    rows = {row["score"]: row for row in before_after_rows(metrics)}
    row = rows["persona_rm"]
    assert row["n"] == 3 and row["contexts"] == 2 and row["ci_low"] <= row["difference"] <= row["ci_high"]
    assert row["ci_low_bca"] <= row["difference"] <= row["ci_high_bca"]
    text = "\n".join(before_after_markdown(metrics))
    assert "| persona_rm | 3 (2) | 2.000 ± 1.000 |" in text and "| judge | 0 | n/a | n/a | n/a | n/a |" in text
    assert "judge failures: 3" in text


def test_a_held_out_set_of_one_meeting_gets_its_accuracy_without_an_interval():
    one_meeting = {"accuracy": proportion(6, 9), "accuracy_by_context": clustered_mean([1.0] * 6 + [0.0] * 3, ["m"] * 9)}
    assert accuracy_lines(one_meeting)[0].startswith(
        "Held-out pair accuracy: 66.7% [no interval] (n=9 from 1 cluster), 95% bootstrap interval over clusters")
