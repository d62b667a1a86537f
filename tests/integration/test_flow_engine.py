"""The flow engine, seen from outside: a running Prefect server, a loopback chat server, `mascot` processes.

What each run did is read from the servers, not from the code under test: requests and requests in
flight are counted by the chat server, and task states and timestamps come from Prefect's API.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import httpx
import polars as pl
import prefect_states
import pytest
import yaml
from chat_server import make_app
from loopback_servers import serve
from stage1_runs import MASCOT, REPO, write_config

pytestmark = pytest.mark.integration

LIMIT = 3  # generation.max_concurrency
TOKENS, SECONDS_PER_TOKEN = 8, 0.02  # 0.16 s a request


@pytest.fixture(scope="module")
def chat():
    with serve(make_app(seconds_per_token=SECONDS_PER_TOKEN)) as url:
        yield url


def stats(chat: str) -> dict:
    return httpx.get(f"{chat}/stats").json()


def http_config(folder: Path, name: str, chat: str, contexts: int = 8, corpus: Path | None = None) -> Path:
    """The tiny config on the chat server: `contexts` contexts x 3 personas, shards of 2, K=2."""
    path = write_config(folder, name, cache_dir=folder / f"{name}-cache", k=2)
    config = yaml.safe_load(path.read_text())
    config["generation"] = {"kind": "openai", "model": "sim-chat", "base_url": f"{chat}/v1",
                            "max_concurrency": LIMIT, "params": {"max_new_tokens": TOKENS}}
    config["data"]["corpus"]["limit"] = contexts
    if corpus is not None:
        config["data"]["corpus"]["path"] = str(corpus)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def mascot(config: Path, run_name: str, api: str, *options: str, python: tuple[str, ...] = (),
           source: Path | None = None, status: int = 0) -> subprocess.CompletedProcess:
    """`mascot run stage1 --until pairs` in a process of its own, reporting to the Prefect server at `api`."""
    env = {**os.environ, "PREFECT_API_URL": api}
    command = [sys.executable, *python, MASCOT]
    if source is not None:  # run the code in `source` instead of the installed package (-c puts the cwd first)
        env["PYTHONPATH"] = str(source)
        command = [sys.executable, *python, "-c", "from cli.main import app; app()"]
    done = subprocess.run([*command, "run", "stage1", "--config", str(config), "--run-name", run_name, "--until",
                           "pairs", *options], check=False, capture_output=True, text=True, env=env, timeout=600,
                          cwd=source)
    assert done.returncode == status, (done.stdout + done.stderr)[-5000:]
    return done


def task_runs(api: str, done: subprocess.CompletedProcess) -> list[dict]:
    return prefect_states.task_runs(api, prefect_states.flow_run_id(done.stdout + done.stderr))


def states(api: str, done: subprocess.CompletedProcess) -> dict[str, set[str]]:
    """Each task's state names in the run: {"sample_candidates": {"Cached"}, ...}."""
    return prefect_states.task_states(api, prefect_states.flow_run_id(done.stdout + done.stderr))


def test_judging_overlaps_sampling_under_one_limit_and_no_torch(tmp_path, prefect_api, chat):
    config = http_config(tmp_path, "engine", chat)
    before = stats(chat)["requests"]
    done = mascot(config, "engine", prefect_api, python=("-X", "importtime"))
    seen = stats(chat)
    assert seen["requests"] - before == 8 * 3, "one request (n=K) per query"
    # 12 shards sample at once, on 16 workers, and the server never sees more than the configured limit.
    assert seen["max_in_flight"] == LIMIT

    runs = task_runs(prefect_api, done)
    sampled = [run["end_time"] for run in runs if run["name"].startswith("sample_candidates")]
    judged = [run["end_time"] for run in runs if run["name"].startswith("judge_candidates")]
    assert len(sampled) == len(judged) == 12
    # Pipelined: shards are judged while later shards still sample.
    assert sum(end < max(sampled) for end in judged) >= 3, (sorted(sampled), sorted(judged))

    heavy = re.findall(r"\|\s+(torch|transformers|trl|peft|nltk)$", done.stderr, re.MULTILINE)
    assert not heavy, f"a pairs-only run on HTTP backends imported {sorted(set(heavy))}"
    assert done.stdout.count("Prefect server: ") == 1 and prefect_api in done.stdout


def test_edit_revert_refresh_on_one_run_name(tmp_path, prefect_api, chat):
    corpus = shutil.copytree(REPO / "mascot" / "data" / "samples" / "empathetic_dialogues", tmp_path / "ed")
    config = http_config(tmp_path, "edits", chat, corpus=corpus)
    run = tmp_path / "runs" / "edits" / "stage1"

    def rerun(*options: str) -> tuple[int, pl.DataFrame, dict[str, set[str]]]:
        """Requests the server received, the pairs, and each step's states as Prefect's API has them."""
        before = stats(chat)["requests"]
        done = mascot(config, "edits", prefect_api, *options)
        return stats(chat)["requests"] - before, pl.read_parquet(run / "pairs.parquet"), states(prefect_api, done)

    _, first, ran = rerun()
    steps = set(ran)
    assert {"sample_candidates", "judge_candidates", "build_pairs"} <= steps and ran["build_pairs"] == {"Completed"}
    candidates = pl.read_parquet(run / "candidates.parquet")
    contexts = pl.read_parquet(run / "contexts.parquet").filter(~pl.col("held_out"))
    # Edit one turn of one sampled context in place, as a user fixing a typo would.
    turn = next(message["content"] for message in contexts["history"][0] if "," not in message["content"])
    original = (corpus / "train.csv").read_text()
    assert original.count(turn) == 1
    (corpus / "train.csv").write_text(original.replace(turn, turn + " Really"))
    requests, _, ran = rerun()
    assert requests == 3, "only the edited context's three queries (one per persona) go to the server"
    assert ran["build_pairs"] == {"Completed"}

    (corpus / "train.csv").write_text(original)  # revert: every step is a cache hit on the first run's keys
    requests, reverted, ran = rerun()
    assert requests == 0 and reverted.equals(first)
    assert pl.read_parquet(run / "candidates.parquet").equals(candidates)
    # write_contexts and build_tiny_models are never cached (they must see an edited corpus or a changed model
    # cache); every step after them is a cache hit
    assert set(ran) == steps and ran.pop("write_contexts") == ran.pop("build_tiny_models") == {"Completed"}
    assert all(found == {"Cached"} for found in ran.values()), ran

    requests, refreshed, ran = rerun("--refresh")  # recomputes every step; the request cache answers the LLM calls
    assert requests == 0 and refreshed.equals(first)
    assert set(ran) == steps and all(found == {"Completed"} for found in ran.values()), ran

    # A step output deleted by hand: the run says so and advises --refresh, which repairs it.
    (run / "candidates.parquet").resolve().unlink()
    failed = mascot(config, "edits", prefect_api, status=1)
    message = " ".join((failed.stdout + failed.stderr).split())
    assert "is missing" in message and "Rerun with --refresh" in message
    requests, repaired, ran = rerun("--refresh")
    assert requests == 0 and repaired.equals(first) and all(found == {"Completed"} for found in ran.values()), ran
    assert pl.read_parquet(run / "candidates.parquet").equals(candidates)


def test_a_code_change_reruns_the_steps_that_run_that_code(tmp_path, prefect_api, chat):
    source = tmp_path / "source"
    for package in ("mascot", "tasks", "flows", "cli"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    config = http_config(tmp_path, "code", chat, contexts=4)

    def rerun() -> dict[str, set[str]]:
        before = stats(chat)["requests"]
        done = mascot(config, "code", prefect_api, source=source)
        assert stats(chat)["requests"] == before, "the request cache answers every LLM call again"
        return states(prefect_api, done)

    mascot(config, "code", prefect_api, source=source)
    cached = {"Cached"}
    found = rerun()
    assert all(found[step] == cached for step in ("sample_candidates", "judge_candidates", "build_pairs")), found

    with (source / "mascot" / "stage1" / "pairs.py").open("a") as pairs:
        pairs.write("\n# an edit to the pair rule's module\n")
    found = rerun()
    assert found["sample_candidates"] == found["judge_candidates"] == cached
    assert found["build_pairs"] == {"Completed"}

    with (source / "mascot" / "judges" / "heuristic.py").open("a") as judge:
        judge.write("\n# an edit to the judge\n")
    found = rerun()
    assert found["sample_candidates"] == cached
    assert found["judge_candidates"] == {"Completed"} and found["build_pairs"] == {"Completed"}


def test_the_tiny_models_build_is_a_step_of_its_own_and_the_first(tmp_path, prefect_api):
    """A fresh model cache: the build is a task run on the server, with its log lines, and the flow's first task
    starts within seconds of the flow, not after minutes of a build in the flow's body."""
    path = write_config(tmp_path, "fresh", cache_dir=tmp_path / "fresh-cache", k=2)
    config = yaml.safe_load(path.read_text())
    config["data"]["corpus"]["limit"] = 2
    config["tiny"]["warm_start_steps"] = 2  # another spec than the session's: a build, and a short one
    config["generation"]["params"] = {"max_new_tokens": 8}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    done = mascot(path, "fresh", prefect_api)
    flow_run = prefect_states.flow_run_id(done.stdout + done.stderr)
    runs = sorted(task_runs(prefect_api, done), key=lambda run: run["start_time"])
    build = [run for run in runs if run["name"].startswith("build_tiny_models")]
    assert len(build) == 1 and build[0]["state"]["type"] == "COMPLETED", [run["name"] for run in runs]
    assert runs[0] is build[0], "the build is the flow's first step: every later one needs its folders"
    started = datetime.fromisoformat(httpx.get(f"{prefect_api}/flow_runs/{flow_run}").json()["start_time"])
    gap = (datetime.fromisoformat(runs[0]["start_time"]) - started).total_seconds()
    assert gap < 10, f"{gap:.1f} s passed between the flow's start and its first task"
    logs = httpx.post(f"{prefect_api}/logs/filter", json={"logs": {"task_run_id": {"any_": [build[0]["id"]]}}})
    said = [log["message"] for log in logs.raise_for_status().json()]
    assert any("tiny models ready after" in message for message in said), said
