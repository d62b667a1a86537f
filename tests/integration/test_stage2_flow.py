"""Stage 2 end to end, as a user runs it: `mascot` processes, a running Prefect server, a loopback
OpenAI-compatible server for every LLM role, real training of the group reward model and the Director.

Every LLM role (Speaker candidates and LLM judge in Stage 1; Director, Speaker, simulated user and LLM
group judge in Stage 2) talks to the chat server, which returns valid structured output where a
request asks for it, so the LLM judges' success path runs into pairs. What was paid for is read
from the server's counters, not from the code under test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import polars as pl
import pytest
import yaml
from chat_server import make_app
from loopback_servers import serve
from prefect_states import latest_flow_runs, task_states
from served_models import ServedModels
from stage1_runs import MASCOT, REPO, write_config

from mascot.config import SamplingParams
from mascot.dialogue.directives import director_messages
from mascot.dialogue.turns import Turn
from mascot.evaluation.systems import SYSTEMS
from mascot.llm import TransformersBackend
from mascot.roster import load_roster

pytestmark = pytest.mark.integration

SESSION_CACHE = Path(os.environ["MASCOT_CACHE_DIR"])


def backend(chat: str, tokens: int = 6) -> dict:
    return {"kind": "openai", "model": "sim-chat", "base_url": f"{chat}/v1", "max_concurrency": 4,
            "max_retries": 0, "params": {"max_new_tokens": tokens}}


def http_stage2_config(folder: Path, chat: str) -> Path:
    """The tiny config with every LLM role on the chat server and small trainers."""
    cache = folder / "cache"  # a request cache of its own, so the server's counters are this test's
    cache.mkdir()
    (cache / "tiny-models").symlink_to(SESSION_CACHE / "tiny-models")  # built once per session
    path = write_config(folder, "http", cache_dir=cache, k=2)
    config = yaml.safe_load(path.read_text())
    config["data"]["corpus"]["limit"] = 6
    config["generation"] = backend(chat)
    config["stage1"]["judges"] = [{"kind": "llm", "name": "sim-judge", "backend": backend(chat, 40)}]
    stage2 = config["stage2"]
    stage2.update(director=backend(chat, 40), speaker=backend(chat), user=backend(chat),
                  judges=[{"kind": "llm", "name": "sim-group-judge", "backend": backend(chat, 40)}])
    stage2["episodes"].update(branches=3, states=2, trajectory_blocks=2, contexts_per_shard=1)
    train = config["train"]
    train["group_rm"].update(epochs=1, save_steps=2)
    train["director"].update(max_steps=2, batch_size=4, num_generations=2, max_completion_length=64, save_steps=1)
    train["director_dpo"].update(epochs=1, save_steps=2)
    train["director_eval"] = {"samples_per_prompt": 1, "bootstrap_resamples": 200}
    config["data"]["held_out"][0]["limit"] = 2  # two ESConv contexts out of domain
    config["eval"].update(judges=[{"kind": "llm", "name": "sim-eval-judge", "backend": backend(chat, 40)}],
                          group_judges=[{"kind": "llm", "name": "sim-eval-group-judge", "backend": backend(chat, 40)}],
                          self_consistency_samples=2, bootstrap_resamples=200)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run(*arguments: str, api: str, status: int = 0) -> str:
    done = subprocess.run([MASCOT, *arguments], capture_output=True, text=True, check=False, timeout=900,
                          env={**os.environ, "PREFECT_API_URL": api})
    output = done.stdout + done.stderr
    assert done.returncode == status, output[-5000:]
    return output


def test_stage2_over_http_survives_a_sigkill_resumes_without_paying_twice_and_trains_both_directors(
        tmp_path, prefect_api, tiny_models):
    # Every request is slow enough that the kill lands while episodes are being generated.
    with serve(make_app(seconds_per_token=0.005, seconds_per_request=0.05)) as chat:
        config = http_stage2_config(tmp_path, chat)
        root = tmp_path / "runs" / "http"
        run("run", "stage1", "--config", str(config), "--run-name", "http", "--until", "pairs", api=prefect_api)
        judgments = pl.read_parquet(root / "stage1" / "judgments.parquet")
        assert judgments["ok"].all() and set(judgments["judge"]) == {"sim-judge"}  # the LLM judge's success path
        assert pl.read_parquet(root / "stage1" / "pairs.parquet").height > 0

        before = httpx.get(f"{chat}/stats").json()
        process = subprocess.Popen([MASCOT, "run", "stage2", "--config", str(config), "--run-name", "http"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                   env={**os.environ, "PREFECT_API_URL": prefect_api})
        deadline = time.monotonic() + 300
        while httpx.get(f"{chat}/stats").json()["requests"] < before["requests"] + 30:
            assert process.poll() is None and time.monotonic() < deadline, "stage 2 ended before the kill"
            time.sleep(0.05)
        # Answers are held, so every answer sent before the kill has reached the client and its cache.
        httpx.post(f"{chat}/hold")
        time.sleep(1.0)
        assert httpx.get(f"{chat}/stats").json()["in_flight"] > 0, "killed with requests in flight"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        httpx.post(f"{chat}/release")
        assert not (root / "stage2" / "episodes.parquet").exists(), "killed during episode generation"

        output = run("resume", str(root), api=prefect_api)
        assert "stage 2 done (director method grpo)" in output
        seen = httpx.get(f"{chat}/stats").json()
        assert seen["answered_again"] == 0, seen  # nothing paid for twice, across the kill

        episodes = pl.read_parquet(root / "stage2" / "episodes.parquet")
        assert episodes["episode_id"].n_unique() == 6 and not episodes["fallback"].any()
        group = pl.read_parquet(root / "stage2" / "judgments.parquet")
        assert group["ok"].all() and group.height == 6 * 2 * 3  # the LLM group judge's success path
        assert pl.read_parquet(root / "stage2" / "pairs.parquet").height > 0
        report = (root / "stage2" / "report.md").read_text()
        summary = json.loads((root / "stage2" / "summary.json").read_text())
        for section in ("Valid directives", "## Group reward model", "Held-out pair accuracy",
                        "## The Director before and after training", "Directive validity (first directive): base",
                        "Reward signal:", "Mode `trajectory`: each sampled directive opens a trajectory of 2 block(s)"):
            assert section in report, section
        assert summary["director_method"] == "grpo" and summary["directives"]["fallbacks"] == 0
        assert summary["director_eval"]["validity"]["base"]["n"] > 0
        assert summary["director_eval"]["signal"]["rollouts"] == 2  # the default: noise and spread apart
        director_round_trip(root / "stage2" / "director", tiny_models.lm)

        # The alternative: DPO over the stored directive pairs, on the same episodes and reward model.
        output = run("run", "stage2", "--config", str(config), "--run-name", "http", "--director-method", "dpo",
                     api=prefect_api)
        assert "stage 2 done (director method dpo)" in output
        summary = json.loads((root / "stage2" / "summary.json").read_text())
        assert summary["director_method"] == "dpo" and summary["director"]["method"] == "dpo"
        assert "not the paper's method" in (root / "stage2" / "report.md").read_text()
        # Its held-out samples' rollouts are new requests or cache hits, never a request paid for twice.
        assert httpx.get(f"{chat}/stats").json()["answered_again"] == 0

        # The evaluation of the trained group against the baselines, by the config's own LLM judges.
        output = run("run", "evaluate", "--config", str(config), "--run-name", "http", api=prefect_api)
        assert "evaluation done" in output
        seen = httpx.get(f"{chat}/stats").json()
        assert seen["answered_again"] == 0, seen
        systems = config_systems(config)
        evaluation_report_is_complete(root / "eval", systems=[*systems[:1], "mascot_dpo", *systems[1:]])
        sft = json.loads((root / "eval" / "sft" / "metrics.json").read_text())
        assert sft["method"] == "sft" and sft["training"]["examples"] > 0
        # Scoring is sharded as playing is: one judging step per conversation shard, so one failed request stops
        # its own shard's requests, not the evaluation's.
        steps = root / "eval" / "steps"
        played = {path.name.split("-0")[0].removeprefix("conversations-") for path in steps.glob("conversations-*-0*")}
        judged = {path.name.split("-0")[0].removeprefix("judgments-") for path in steps.glob("judgments-*-0*")}
        assert played and judged == played
        assert len(list(steps.glob("judgments-*-0*"))) == len(list(steps.glob("conversations-*-0*")))
        run("run", "evaluate", "--config", str(config), "--run-name", "http", api=prefect_api)
        assert httpx.get(f"{chat}/stats").json()["requests"] == seen["requests"]  # a rerun asks nothing


def config_systems(config: Path) -> list[str]:
    return yaml.safe_load(config.read_text())["eval"]["systems"]


CELL = r"-?\d+\.\d+( ± \d+\.\d+)? \[-?\d+\.\d+, -?\d+\.\d+\]( \(\d+ undefined\))?"
DIFFERENCE = r"[+-]\d+\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\], p_holm \d\.\d{3}"


def evaluation_report_is_complete(folder: Path, systems: list[str]) -> None:
    """Every number of the evaluation has its n, seeds, spread and interval, and every difference its
    baseline: read from summary.json's entries and from every cell of report.md's tables."""
    import re

    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["contexts"]) == {"held_out", "esconv:test"} and summary["contexts"]["esconv:test"] == 2
    for name, results in summary["results"].items():
        assert {e["system"] for e in results["summaries"]} == set(systems), name
        for entry in results["summaries"]:
            assert entry["n"] > 0 and entry["contexts"] > 0 and entry["seeds"] == 1, entry
            assert None not in (entry["mean"], entry["ci_low"], entry["ci_high"]), entry
            # a metric undefined for all but one conversation (an empty reply has no Self-BLEU) has no spread
            assert entry["sd"] is not None or (entry["n"] == 1 and entry["undefined"] > 0), entry
        assert {e["baseline"] for e in results["comparisons"]} == set(systems) - {"mascot"}, name
        for entry in results["comparisons"]:
            assert entry["system"] == "mascot" and entry["contexts"] > 0 and entry["seeds"] == 1, entry
            assert None not in (entry["mean"], entry["ci_low"], entry["ci_high"], entry["p_holm"]), entry
            assert entry["sd"] is not None or entry["contexts"] == 1, entry

    report = (folder / "report.md").read_text()
    first = report.split("## Systems")[0]
    assert "sim-eval-judge (persona level)" in first and "Seeds: 1 (0)" in first
    # The evaluation's panels are named apart from the training judges, but they are the same model (sim-chat):
    # sharing is by the model, so the report says so; the pairwise judge (heuristic) is not shared.
    assert ("also labelled the training data: sim-eval-group-judge (model sim-chat, collective; in training as "
            "stage1 'sim-judge', stage2 'sim-group-judge'); sim-eval-judge (model sim-chat, persona; in training as "
            "stage1 'sim-judge', stage2 'sim-group-judge')") in " ".join(first.split())
    scores = report.split("## Head-to-head preference")[0]
    rows = [line for line in scores.splitlines() if line.startswith("| ") and not line.startswith("| system |")
            and not line.startswith("| MASCOT − baseline") and "---" not in line]
    tables = 0
    for line in rows:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0].startswith("− "):  # a comparison row: MASCOT minus the baseline it names
            assert re.fullmatch(r"\d+, 1", cells[1]), line
            assert all(re.fullmatch(DIFFERENCE, cell) for cell in cells[2:]), line
            tables += 1
        elif re.fullmatch(r"\d+ \(\d+, 1\)", cells[1]):  # a system row: n (contexts, seeds)
            assert all(re.fullmatch(CELL, cell) for cell in cells[2:]), line
    # three sets (all, held out, ESConv), three levels; the collective level compares MASCOT with groups only
    groups = [name for name in systems if SYSTEMS[name].group]
    assert tables == 3 * (2 * (len(systems) - 1) + len(groups) - 1)

    # Head-to-head: the pairwise judge saw every pair in both orders, and every win rate has its interval.
    preferences = pl.read_parquet(folder / "preferences.parquet")
    assert preferences.group_by("baseline", "context_id", "seed").len()["len"].to_list() == \
        [2] * (preferences.height // 2)
    assert set(preferences["order"]) == {"mascot_first", "mascot_second"}
    for entry in summary["preferences"]:
        assert entry["n"] + entry["failed_pairs"] == preferences.filter(pl.col("baseline") == entry["baseline"]).height // 2
        assert entry["wins"] + entry["ties"] + entry["losses"] == entry["n"] and entry["seeds"] == 1
        assert None not in (entry["win_rate"], entry["ci_low"], entry["ci_high"], entry["position_consistency"])
    assert {e["baseline"] for e in summary["preferences"]} == set(systems) - {"mascot"}
    assert "## Head-to-head preference" in report


def director_round_trip(adapter: Path, base: Path) -> None:
    """The trained Director adapter, loaded back with PEFT, holds GRPO's updates, and the project's
    in-process backend serves it: it answers the Director's prompt as PEFT's own merged model does."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    metrics = json.loads((adapter / "metrics.json").read_text())
    # A group whose samples were rewarded alike (all invalid directives, say) gives no gradient.
    assert any(step["frac_reward_zero_std"] < 1 for step in metrics["log_history"]), "some group had a signal"
    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    lora_b = [p for name, p in policy.named_parameters() if "lora_B" in name]
    assert lora_b and any(torch.count_nonzero(p) for p in lora_b), "GRPO's updates were saved"
    assert metrics["training"]["steps"] == 2 and metrics["reward_names"] == ["group_rm", "format"]

    roster = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
    messages = director_messages(roster, [Turn("user", "I failed my driving test again.", role="context")])
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    merged = policy.merge_and_unload().eval()
    with torch.inference_mode():
        output = merged.generate(**inputs, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    expected = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    served = asyncio.run(TransformersBackend(base, adapter=adapter, device="cpu").generate(
        messages, n=1, params=SamplingParams(temperature=0.0, max_new_tokens=24), seed=0))
    assert served == [expected]


def test_stage2_without_a_finished_stage1_says_what_to_run(tmp_path, prefect_api):
    config = write_config(tmp_path, "nostage1")
    output = run("run", "stage2", "--config", str(config), "--run-name", "fresh", api=prefect_api, status=2)
    assert "reads stage1/contexts" in output and "mascot run stage1" in output, output[-2000:]
    assert not (tmp_path / "runs" / "fresh").exists()


def test_the_pipeline_runs_every_stage_as_a_subflow_of_one_flow_run_and_resumes_as_a_whole(tmp_path, prefect_api,
                                                                                          tiny_models):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # The server plays vLLM with runtime LoRA loading, serving `sim-chat` as the base model.
    served = ServedModels("sim-chat", allow_runtime_lora=True)
    with serve(make_app(seconds_per_token=0.001, served=served)) as chat:
        config = http_stage2_config(tmp_path, chat)
        smaller = yaml.safe_load(config.read_text())  # what this test reads needs few episodes and systems
        smaller["stage2"]["episodes"].update(branches=2, states=1, trajectory_blocks=1)
        smaller["eval"]["systems"] = ["mascot", "mascot_c", "zero_shot"]
        # The trained Speaker and Director as the paper profile serves them: the flow loads each into the server.
        smaller["stage2"]["speaker"]["load_adapter"] = True
        smaller["eval"]["director"] = {**backend(chat, 40), "load_adapter": True}
        config.write_text(yaml.safe_dump(smaller, sort_keys=False))
        output = run("run", "pipeline", "--config", str(config), "--run-name", "piped", api=prefect_api)
        assert "pipeline done (director method grpo)" in output
        # `make demo`'s last step: it ends with the evaluation's headline table, once.
        assert output.count("Evaluation of piped") == 1, output[-5000:]
        root = tmp_path / "runs" / "piped"
        for report in ("stage1/report.md", "stage2/report.md", "eval/report.md"):
            assert (root / report).exists(), report
        manifest = json.loads((root / "manifest.json").read_text())
        assert manifest["resume"] == {"stage": "pipeline", "until": "grpo"}
        # Each trained adapter reached the server before its role's first request, under a name with its hash, and
        # every request of the role named it.
        names = [f"{role}-{manifest['artifacts'][artifact]['sha256'][:8]}"
                 for role, artifact in (("speaker", "stage1/speaker"), ("director", "stage2/director"))]
        assert served.loads == names and sorted(served.modules) == sorted(names)
        asked = httpx.get(f"{chat}/stats").json()["by_model"]
        assert all(asked.get(name, 0) > 0 for name in names), asked

        # Read from the Prefect server: one pipeline flow run, and each stage a flow run under it.
        with temporary_settings(updates={PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
            runs = {run.name: run for run in client.read_flow_runs() if run.name.endswith("/piped")}
            assert set(runs) == {"pipeline/piped", "stage1/piped", "stage2/piped", "evaluate/piped"}, set(runs)
            assert runs["pipeline/piped"].parent_task_run_id is None
            for stage in ("stage1/piped", "stage2/piped", "evaluate/piped"):
                parent = client.read_task_run(runs[stage].parent_task_run_id)
                assert parent.flow_run_id == runs["pipeline/piped"].id, stage
                assert runs[stage].state.is_completed()

        # `mascot resume` reruns the whole pipeline, every step a cache hit, no request sent again.
        before = httpx.get(f"{chat}/stats").json()["requests"]
        output = run("resume", str(root), api=prefect_api)
        assert "resuming pipeline" in output and "pipeline done" in output
        assert output.count("Evaluation of piped") == 1, output[-5000:]
        assert httpx.get(f"{chat}/stats").json()["requests"] == before
        resumed = latest_flow_runs(prefect_api, ["stage1/piped", "stage2/piped", "evaluate/piped"])
        for stage, flow_run in resumed.items():
            assert flow_run["id"] != str(runs[stage].id), f"{stage} was not run again"
            ran = task_states(prefect_api, flow_run["id"])
            ran.pop("write_contexts", None)  # never cached: it must notice an edited corpus
            ran.pop("build_tiny_models", None)  # nor this: it must notice a changed model cache
            if stage != "stage1/piped":  # nor this: a server may have restarted since (it loaded nothing again)
                assert ran.pop("serve_adapter") == {"Completed"}, (stage, ran)
            assert ran and all(states == {"Cached"} for states in ran.values()), (stage, ran)
        assert served.loads == names


def test_training_seeds_train_the_group_twice_play_mascot_per_seed_and_rerun_from_the_cache(tmp_path, prefect_api,
                                                                                            tiny_models):
    """eval.training_seeds 2 on the smallest world: the Speaker and the GRPO Director are trained twice, each seed's
    adapter beside the first and loaded into the server under a role name of its own; MASCOT's conversations hold
    both training seeds and a baseline's one; a rerun is all cache hits."""
    served = ServedModels("sim-chat", allow_runtime_lora=True)
    with serve(make_app(seconds_per_token=0.001, served=served)) as chat:
        config = http_stage2_config(tmp_path, chat)
        smaller = yaml.safe_load(config.read_text())
        smaller["data"]["held_out"][0]["limit"] = 1
        smaller["stage2"]["episodes"].update(branches=2, states=1, trajectory_blocks=1)
        smaller["train"]["speaker"].update(max_steps=2, save_steps=1)
        smaller["train"]["director"].update(max_steps=1)
        smaller["eval"].update(systems=["mascot", "zero_shot"], training_seeds=2, blocks=1)
        smaller["stage2"]["speaker"]["load_adapter"] = True
        smaller["eval"]["director"] = {**backend(chat, 40), "load_adapter": True}
        config.write_text(yaml.safe_dump(smaller, sort_keys=False))
        started = time.monotonic()
        run("run", "pipeline", "--config", str(config), "--run-name", "twice", api=prefect_api)
        print(f"pipeline with two training seeds: {time.monotonic() - started:.0f} s")
        root = tmp_path / "runs" / "twice"
        manifest = json.loads((root / "manifest.json").read_text())["artifacts"]
        for name in ("stage1/speaker", "stage1/speaker-seed1", "stage2/director", "stage2/director-seed1"):
            assert name in manifest and (root / name / "adapter_config.json").exists(), name
        # The weights, not the folders' hashes: a folder's training_args.bin names its own checkpoint folder.
        for first, second in (("stage1/speaker", "stage1/speaker-seed1"), ("stage2/director", "stage2/director-seed1")):
            weights = [(root / name / "adapter_model.safetensors").read_bytes() for name in (first, second)]
            assert weights[0] != weights[1], f"{second} trained the same weights as {first}: its seed was not offset"
        # Each seed's adapter reached the server under its own role name, so loading one retired no other.
        names = {f"{role}-{manifest[artifact]['sha256'][:8]}" for role, artifact in (
            ("speaker", "stage1/speaker"), ("speaker-seed1", "stage1/speaker-seed1"),
            ("director", "stage2/director"), ("director-seed1", "stage2/director-seed1"))}
        assert names <= set(served.modules), (names, served.modules)
        played = pl.read_parquet(root / "eval" / "conversations.parquet")
        seeds = dict(played.group_by("system").agg(pl.col("training_seed").unique().sort()).iter_rows())
        assert {system: list(runs) for system, runs in seeds.items()} == {"mascot": [0, 1], "zero_shot": [0]}
        summary = json.loads((root / "eval" / "summary.json").read_text())
        assert summary["training_seeds"] == 2
        mascot = next(e for e in summary["results"]["all"]["summaries"] if e["system"] == "mascot")
        assert mascot["training_seeds"] == 2 and "training seeds" in mascot["interval"]
        assert "Training seeds: 2 (eval.training_seeds)" in (root / "eval" / "report.md").read_text()

        before = httpx.get(f"{chat}/stats").json()["requests"]
        run("run", "pipeline", "--config", str(config), "--run-name", "twice", api=prefect_api)
        assert httpx.get(f"{chat}/stats").json()["requests"] == before
        rerun = latest_flow_runs(prefect_api, ["stage1/twice", "stage2/twice", "evaluate/twice"])
        for stage, flow_run in rerun.items():
            ran = task_states(prefect_api, flow_run["id"])
            for uncached in ("write_contexts", "build_tiny_models", "serve_adapter"):
                ran.pop(uncached, None)
            assert ran and all(states == {"Cached"} for states in ran.values()), (stage, ran)
