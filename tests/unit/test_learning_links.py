"""`benchmarks/learning.py --builds` says which link of the chain was flat in a build, from its run directory."""

from __future__ import annotations

import json
from pathlib import Path

from benchmark_scripts import load_benchmark


def _write(run: Path, parts: tuple[str, ...], document: dict) -> None:
    path = run.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def accuracy(value: float, low: float, high: float) -> dict:
    return {"value": value, "ci_low": low, "ci_high": high}


def test_a_link_is_flat_where_its_interval_reaches_chance(tmp_path):
    _write(tmp_path, ("stage1", "persona_rm", "metrics.json"), {"held_out": {
        "accuracy": accuracy(0.739, 0.694, 0.779), "persona_swap": {"accuracy": accuracy(0.5, 0.443, 0.557)}}})
    _write(tmp_path, ("stage2", "group_rm", "metrics.json"), {"held_out": {"accuracy": accuracy(0.95, 0.92, 0.97)}})
    _write(tmp_path, ("stage2", "summary.json"), {"first_speakers": {
        "anchor": accuracy(0.008, -0.032, 0.047), "beacon": accuracy(0.127, 0.068, 0.184),
        "catalyst": accuracy(-0.078, -0.118, -0.037)}})
    _write(tmp_path, ("stage2", "director_eval", "metrics.json"), {
        "signal": {"directive_sd": 0.235, "directive_sd_ci": [0.0, 0.333]},
        "validity": {"base": {"value": 0.925}, "director": {"value": 0.95}}})
    links = load_benchmark("learning").chain_links(tmp_path)
    assert links["persona RM pairs"] == "73.9% [69.4%, 77.9%]"
    assert links["persona swap"] == "50.0% [44.3%, 55.7%] flat"
    assert links["judge: first speaker"] == "beacon +0.127 [+0.068, +0.184]"
    assert links["group RM pairs"] == "95.0% [92.0%, 97.0%]"
    assert links["directive spread (sd)"] == "0.235 [0.000, 0.333] flat"
    assert links["valid: base -> trained"] == "92.5% -> 95.0%"

    _write(tmp_path, ("stage2", "director_eval", "metrics.json"), {
        "signal": {"directive_sd": 0.3, "directive_sd_ci": [0.1, 0.4]},
        "validity": {"base": {"value": 0.9}, "director": {"value": 0.9}}})
    assert load_benchmark("learning").chain_links(tmp_path)["directive spread (sd)"] == "0.300 [0.100, 0.400]"

    _write(tmp_path, ("stage2", "director_eval", "metrics.json"), {
        "signal": {"directive_sd": None, "directive_sd_ci": None},
        "validity": {"base": {"value": 0.1}, "director": {"value": 0.1}}})
    assert load_benchmark("learning").chain_links(tmp_path)["directive spread (sd)"] == "none (needs 2 rollouts and a state with 2 valid directives)"


def test_the_judges_first_speaker_is_flat_where_every_personas_interval_holds_0(tmp_path):
    _write(tmp_path, ("stage1", "persona_rm", "metrics.json"), {"held_out": {
        "accuracy": accuracy(0.7, 0.6, 0.8), "persona_swap": {"accuracy": accuracy(0.9, 0.8, 0.95)}}})
    _write(tmp_path, ("stage2", "group_rm", "metrics.json"), {"held_out": {"accuracy": accuracy(0.7, 0.6, 0.8)}})
    _write(tmp_path, ("stage2", "director_eval", "metrics.json"), {
        "signal": {"directive_sd": 0.0, "directive_sd_ci": [0.0, 0.2]},
        "validity": {"base": {"value": 0.9}, "director": {"value": 0.9}}})
    # The Catalyst trails with its interval below 0, so the judge does tell first speakers apart: not flat.
    _write(tmp_path, ("stage2", "summary.json"), {"first_speakers": {
        "anchor": accuracy(0.02, -0.01, 0.05), "catalyst": accuracy(-0.1, -0.15, -0.05)}})
    assert load_benchmark("learning").chain_links(tmp_path)["judge: first speaker"] == "anchor +0.020 [-0.010, +0.050]"
    _write(tmp_path, ("stage2", "summary.json"), {"first_speakers": {
        "anchor": accuracy(0.02, -0.01, 0.05), "catalyst": accuracy(-0.02, -0.05, 0.01)}})
    assert load_benchmark("learning").chain_links(tmp_path)["judge: first speaker"] == "anchor +0.020 [-0.010, +0.050] flat"
    _write(tmp_path, ("stage2", "summary.json"), {})  # a report from before the judge's first speakers
    assert load_benchmark("learning").chain_links(tmp_path)["judge: first speaker"] == "not in this run's report"
