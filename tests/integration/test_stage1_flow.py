"""`mascot run stage1 --until pairs` end to end: real Prefect (embedded server), real tiny models.

Each run is a separate `mascot` process, as a user would start it, so a rerun really resumes from
what the first process left on disk, and a SIGKILL really kills the flow mid-way.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import polars as pl
import pytest
import yaml
from stage1_runs import REPO, finish, mascot_run, write_config

from mascot.config import load_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_models):
    # The session's tiny models are already built in MASCOT_CACHE_DIR, so runs reuse them.
    return tmp_path_factory.mktemp("stage1")


@pytest.fixture(scope="module")
def finished_run(workdir):
    config = write_config(workdir)
    finish(mascot_run(config, "uninterrupted"))
    return config, workdir / "runs" / "uninterrupted"


def test_pairs_respect_the_rules(finished_run):
    config, run = finished_run
    settings = yaml.safe_load(config.read_text())["stage1"]
    k, margin = settings["k"], settings["margin"]
    for name in ("contexts", "candidates", "judgments", "pairs"):
        assert (run / "stage1" / f"{name}.parquet").exists(), name
    candidates = pl.read_parquet(run / "stage1" / "candidates.parquet")
    judgments = pl.read_parquet(run / "stage1" / "judgments.parquet")
    pairs = pl.read_parquet(run / "stage1" / "pairs.parquet")
    assert candidates.group_by("query_id").len()["len"].to_list() == [k] * candidates["query_id"].n_unique()
    assert pairs.height > 0
    assert pairs.group_by("query_id").len()["len"].max() <= k * (k - 1) // 2
    assert (pairs["margin"] >= margin - 1e-9).all()
    assert (pairs["chosen"].str.strip_chars() != pairs["rejected"].str.strip_chars()).all()
    failed = judgments.filter(~pl.col("ok")).select("query_id", "candidate_idx")
    for side in ("chosen_idx", "rejected_idx"):
        used = pairs.select("query_id", pl.col(side).alias("candidate_idx"))
        assert used.join(failed, on=["query_id", "candidate_idx"]).height == 0
    assert {"query_id", "persona", "prompt", "chosen", "rejected", "chosen_score", "rejected_score",
            "margin"} <= set(pairs.columns)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config_hash"] and "stage1/pairs" in manifest["artifacts"]
    summary = json.loads((run / "stage1" / "summary.json").read_text())
    assert summary["counts"]["pairs"] == pairs.height
    assert list((run / "wandb").glob("offline-run-*")), "the run logged to an offline wandb run"


def test_rerun_makes_no_backend_requests(finished_run):
    config, run = finished_run
    before = (run / "stage1" / "pairs.parquet").read_bytes()
    requests = load_config(config).cache.requests
    stored = stored_requests(requests)
    output = finish(mascot_run(config, "uninterrupted"))
    # Every backend answer is stored in the request cache, so a request that reached a backend adds a row.
    assert stored_requests(requests) == stored
    assert (run / "stage1" / "pairs.parquet").read_bytes() == before
    finished = [line for line in output.splitlines() if "Task run '" in line and "Finished in state" in line]
    never_cached = ("write_contexts", "build_tiny_models")
    assert finished and all("Cached" in line for line in finished if not any(name in line for name in never_cached))


def stored_requests(path: Path) -> int:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]


def test_sigkill_mid_run_then_resume_gives_the_same_pairs(finished_run, workdir, tiny_models):
    _, reference = finished_run
    # A fresh request cache, so the killed run really samples and judges (the tiny models are shared).
    cache = workdir / "killed-cache"
    cache.mkdir()
    (cache / "tiny-models").symlink_to(tiny_models.lm.parents[1])
    config = write_config(workdir, "killed", cache_dir=cache)
    run = workdir / "runs" / "killed"
    # Unbuffered, so that the log lines written before the kill are not lost with it.
    process = mascot_run(config, "killed", start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    steps = run / "stage1" / "steps"
    deadline = time.monotonic() + 300
    while not (steps.exists() and any(steps.glob("judgments-0*.parquet"))):
        assert process.poll() is None, process.communicate()[0][-5000:]
        assert time.monotonic() < deadline, "no judgment shard appeared"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    before_kill = process.communicate()[0]
    assert not (run / "stage1" / "pairs.parquet").exists(), "the kill came too late to test resuming"
    # Shards whose task finished before the kill. A shard's file can be on disk with its task still running
    # when the kill comes; that shard is run again, its requests answered by the request cache.
    sampled = sum("Task run 'sample_candidates-" in line and "Finished in state Completed" in line
                  for line in before_kill.splitlines())
    output = finish(mascot_run(config, "killed"))
    reused = [line for line in output.splitlines() if "Task run 'sample_candidates-" in line and "Cached" in line]
    assert len(reused) >= sampled >= 1, "every shard sampled before the kill is a cache hit, not sampled again"
    resumed = pl.read_parquet(run / "stage1" / "pairs.parquet")
    expected = pl.read_parquet(reference / "stage1" / "pairs.parquet")
    assert resumed.equals(expected)


def served_config(workdir: Path, url: str, model: str, name: str, max_failure_rate: float) -> Path:
    """Sampling and an LLM judge both on `transformers serve`; the tiny judge cannot meet the schema."""
    server = {"kind": "openai", "model": model, "base_url": url, "timeout_s": 60, "max_retries": 1}
    judge_backend = {**server, "params": {"temperature": 1.0, "max_new_tokens": 12}}
    path = write_config(workdir, name, k=2, max_judge_failure_rate=max_failure_rate,
                        judges=[{"kind": "heuristic"},
                                {"kind": "llm", "name": "tiny-judge", "backend": judge_backend, "max_attempts": 2}])
    config = yaml.safe_load(path.read_text())
    config["generation"] = {**server, "params": {"max_new_tokens": 16}}
    config["data"]["corpus"]["limit"] = 2
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_llm_judge_failures_are_counted_and_the_threshold_applies(served, workdir):
    model, url, log = served
    strict = served_config(workdir, url, model, "strict", max_failure_rate=0.4)  # half will fail
    process = mascot_run(strict, "strict")
    output, _ = process.communicate(timeout=600)
    assert process.returncode != 0
    assert "judgments failed" in output and "tiny-judge" in output and "max_judge_failure_rate" in output

    lenient = served_config(workdir, url, model, "lenient", max_failure_rate=1.0)
    finish(mascot_run(lenient, "lenient"))
    run = workdir / "runs" / "lenient"
    judgments = pl.read_parquet(run / "stage1" / "judgments.parquet")
    failed = judgments.filter(~pl.col("ok"))
    assert set(failed["judge"]) == {"tiny-judge"} and failed.height == judgments.height // 2
    assert failed["overall"].null_count() == failed.height and (failed["attempts"] == 2).all()
    summary = json.loads((run / "stage1" / "summary.json").read_text())
    assert summary["counts"]["judge_failures"] == failed.height
    # A candidate enters pairs only when every judge scored it, so none does here.
    assert pl.read_parquet(run / "stage1" / "pairs.parquet").height == 0

    before = log.chat_requests()
    finish(mascot_run(lenient, "lenient"))
    time.sleep(0.5)
    assert log.chat_requests() == before, "a finished run, rerun, sends nothing to the server"


def test_a_rubric_change_reruns_judging_but_not_sampling(workdir):
    rubric = yaml.safe_load((REPO / "configs" / "rubrics" / "emotional_support.yaml").read_text())
    path = workdir / "rubric.yaml"
    path.write_text(yaml.safe_dump(rubric, sort_keys=False))
    config = write_config(workdir, "rubric-change", rubric=str(path))
    finish(mascot_run(config, "rubric-change"))
    rubric["criteria"].pop()  # one criterion fewer: other overall scores, so other pairs
    path.write_text(yaml.safe_dump(rubric, sort_keys=False))
    output = finish(mascot_run(config, "rubric-change"))
    states = {step: [line for line in output.splitlines() if f"Task run '{step}-" in line]
              for step in ("sample_candidates", "judge_candidates", "build_pairs")}
    assert states["sample_candidates"] and all("Cached" in line for line in states["sample_candidates"])
    assert states["judge_candidates"] and not any("Cached" in line for line in states["judge_candidates"])
    assert states["build_pairs"] and "Cached" not in states["build_pairs"][0]
