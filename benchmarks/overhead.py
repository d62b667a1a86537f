"""Benchmark: the fixed cost of the flow engine, against a bare asyncio loop doing the same Stage 1 work.

    python benchmarks/overhead.py [--contexts 64 --k 8 --tokens 32 --concurrency 8 --seconds-per-token 0.03 \
                                   --rounds 3 --shard-size 8 --keep]

Starts one simulated chat server (tests/chat_server.py) and one `prefect server start`, writes a
seeded synthetic Empathetic Dialogues corpus and configs derived from configs/tiny.yaml, then, in
each round, runs four sides, each a fresh subprocess: `bare` (this script's hidden --bare-job
mode: the library's contexts, queries, prompts and seeds, the openai client, a semaphore, the
heuristic judge on each query as soon as it is sampled, and the pair builder; no Prefect, no
cache), `flow (running server)` (`mascot run
stage1 --until pairs` against the Prefect server), `rerun (running server)` (the same command again:
everything is cached) and `flow (embedded server)` (no PREFECT_API_URL). It checks that the bare
loop and the flows sampled the same texts and built as many pairs, and prints the medians of each
side's wall time, phases, CPU and peak memory, and the ratios against the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import polars as pl
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
BIN = Path(sys.executable).parent
MODEL = "sim-chat"
SIDES = ("bare", "flow (running server)", "rerun (running server)", "flow (embedded server)")
COLUMNS = ("wall", "startup", "active", "tail", "cpu", "pss_mb", "requests", "max_in_flight")
# Words for the synthetic corpus; the commas exercise the release's `_comma_` escaping.
WHO = ("my sister", "my boss", "an old friend", "my neighbour", "my landlord", "my son", "a coworker")
WHAT = ("called me out of the blue", "forgot my birthday", "got the promotion I wanted", "moved away",
        "cancelled our trip at the last minute", "stopped answering my messages")
SEEKER = ("I keep thinking about it, honestly.", "I did not expect that at all.", "I am not sure what to do, really.")
LISTENER = ("That sounds like a lot to take in.", "How are you feeling about it now?", "Oh wow, what happened then?")


class BenchmarkError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_json(url: str, post: bool = False) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST" if post else "GET"), timeout=10) as answer:
        return json.loads(answer.read())


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchmarkError(f"{what} exited with status {process.returncode} before it was healthy")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.2)
    raise BenchmarkError(f"{what} was not healthy at {url} within {timeout_s:g} s")


def stop(process: subprocess.Popen | None) -> None:
    """Stop a server this script started (in its own session) and every process it started."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def write_corpus(folder: Path, conversations: int, seed: int) -> Path:
    """A train.csv in the Empathetic Dialogues release format: one row per utterance, commas as `_comma_`."""
    from mascot.data.empathetic_dialogues import RELEASE_COLUMNS
    from mascot.data.valence import ED_EMOTIONS

    rng, lines = random.Random(seed), [",".join(RELEASE_COLUMNS)]
    for conv in range(conversations):
        emotion, situation = rng.choice(ED_EMOTIONS), f"{rng.choice(WHO).capitalize()} {rng.choice(WHAT)}."
        seeker, listener = str(rng.randrange(1, 999)), str(rng.randrange(1000, 1999))
        for turn in range(rng.randint(1, 5)):  # seeker first; an even count leaves a reference reply
            text = rng.choice(LISTENER if turn % 2 else SEEKER)
            text = f"{situation} {text}" if turn == 0 else text
            fields = [f"hit:{conv}_conv:{2 * conv}", str(turn + 1), emotion, situation,
                      listener if turn % 2 else seeker, text, "5|5|4_2|3|5", ""]
            lines.append(",".join(field.replace(",", "_comma_") for field in fields))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.csv").write_text("\n".join(lines) + "\n")
    return folder


def write_config(path: Path, args: argparse.Namespace, corpus: Path, port: int, cache: Path, runs: Path) -> Path:
    """configs/tiny.yaml with the synthetic corpus, the simulated server, the job's K and a cache of its own."""
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["run"]["output_dir"] = str(runs)
    data = config["data"]
    data |= {"roster": str(CONFIGS / data["roster"]), "users": str(CONFIGS / data["users"])}
    data["corpus"] |= {"path": str(corpus), "limit": args.contexts}
    config["generation"] = {"kind": "openai", "model": MODEL, "base_url": f"http://127.0.0.1:{port}/v1",
                            "max_concurrency": args.concurrency,
                            "params": {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": args.tokens}}
    config["stage1"] |= {"k": args.k, "margin": args.margin, "shard_size": args.shard_size,
                         "rubric": str(CONFIGS / config["stage1"]["rubric"]), "judges": [{"kind": "heuristic"}]}
    # The trainers keep their tiny:* models: `--until pairs` trains nothing, so the flow builds none. The job is
    # Stage 1's alone, so the later stages' sections (whose files are relative to configs/) go.
    for section in ("stage2", "eval"):
        config.pop(section, None)
    config["cache"] = {"dir": str(cache)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def bare_job(config_path: Path, out: Path) -> None:
    """Stage 1 up to pairs as a careful plain script: the library's inputs, prompts, seeds, judge and pair rule;
    the openai client and a semaphore, each query judged as soon as its replies arrive (judging overlaps the
    sampling of the others, as the flow's pipelined shards do); no Prefect, no cache, no shards."""
    import asyncio

    from openai import AsyncOpenAI

    from mascot.config import load_config
    from mascot.data.contexts import write_contexts
    from mascot.judges import panel as judging
    from mascot.judges.base import JudgeItem
    from mascot.llm import normalize_messages
    from mascot.prompts import speaker_messages
    from mascot.queries import Queries, request_seed
    from mascot.roster import load_roster
    from mascot.stage1.pairs import build_preference_pairs

    config = load_config(config_path)
    seed, generation, stage1 = config.run.seed, config.generation, config.stage1
    params = generation.params
    contexts = write_contexts(config.data, seed, out / "contexts.parquet")  # what the flow's first step writes
    batch = Queries(contexts=contexts, roster=load_roster(config.data.roster)).load()
    by_id = {query.id: query for query in batch}
    panel = judging.PanelSpec.load(stage1.judges, stage1.rubric)

    async def sample(query, client: AsyncOpenAI, semaphore: asyncio.Semaphore) -> list[str]:
        async with semaphore:
            completion = await client.chat.completions.create(
                model=generation.model, messages=normalize_messages(speaker_messages(query.persona, query.context)),
                n=stage1.k, seed=request_seed(seed, query.id), temperature=params.temperature, top_p=params.top_p,
                max_tokens=params.max_new_tokens)
        return [(choice.message.content or "").strip() for choice in sorted(completion.choices, key=lambda c: c.index)]

    judge = judging.make_panel(panel)

    async def sample_and_judge(query, client: AsyncOpenAI, semaphore: asyncio.Semaphore) -> tuple[list[dict], list]:
        texts = await sample(query, client, semaphore)
        rows = [{"query_id": query.id, "persona": query.persona.id, "candidate_idx": i, "text": text}
                for i, text in enumerate(texts)]
        items = [JudgeItem(query_id=query.id, candidate_idx=row["candidate_idx"], candidate=row["text"],
                           context=query.context, persona=query.persona) for row in rows]
        return rows, await judge.judge_all(items, seed)

    async def run() -> tuple[list[dict], list]:
        client = AsyncOpenAI(base_url=generation.base_url, api_key="EMPTY", max_retries=generation.max_retries)
        semaphore = asyncio.Semaphore(generation.max_concurrency)
        done = await asyncio.gather(*(sample_and_judge(query, client, semaphore) for query in batch))
        return [row for rows, _ in done for row in rows], [judgment for _, judged in done for judgment in judged]

    rows, judged = asyncio.run(run())
    candidates, judgments = pl.DataFrame(rows), judging.judgments_frame(judged, panel.rubric)
    judging.check_failure_rate(judgments, stage1.max_judge_failure_rate)
    scores = judging.aggregate_scores(judgments, stage1.aggregation)
    pairs = build_preference_pairs(candidates, scores, margin=stage1.margin,
                                   max_pairs_per_query=stage1.max_pairs_per_query)
    prompt_type = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
    prompts = [speaker_messages(by_id[query_id].persona, by_id[query_id].context) for query_id in pairs["query_id"]]
    candidates.write_parquet(out / "candidates.parquet")
    judgments.write_parquet(out / "judgments.parquet")
    pairs.with_columns(prompt=pl.Series(prompts, dtype=prompt_type)).write_parquet(out / "pairs.parquet")


def process_tree(root: int) -> list[int]:
    """`root` and its descendants, from the parent ids in /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path("/proc", entry.name, "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        tree.append(pid := todo.pop())
        todo += children.get(pid, [])
    return tree


def tree_pss_kb(root: int) -> int:
    total = 0
    for pid in process_tree(root):
        try:
            rollup = Path("/proc", str(pid), "smaps_rollup").read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        total += sum(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
    return total


def flow_command(config: Path, run_name: str) -> list[str]:
    return [str(BIN / "mascot"), "run", "stage1", "--config", str(config), "--run-name", run_name, "--until", "pairs"]


def run_side(command: list[str], env: dict, log: Path, server: str) -> dict:
    """Run one side in a fresh process; its wall time, phases (from the chat server's clock), CPU and peak PSS."""
    http_json(f"{server}/stats/reset", post=True)
    before, peak, done = resource.getrusage(resource.RUSAGE_CHILDREN), [0], threading.Event()
    start = time.time()
    with open(log, "w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, cwd=REPO)

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], tree_pss_kb(process.pid))
                done.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = process.wait()
        end = time.time()
        done.set()
        sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise BenchmarkError(f"{' '.join(command)} exited with status {code}; the end of {log}:\n{tail}")
    stats = http_json(f"{server}/stats")
    first, last = stats["first_request_at"], stats["last_response_at"]
    phases = (first - start, last - first, end - last) if stats["requests"] else (None, None, None)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    measured = (end - start, *phases, cpu, peak[0] / 1024, stats["requests"], stats["max_in_flight"])
    return dict(zip(COLUMNS, measured, strict=True))


def same_work(bare: Path, run: Path) -> None:
    """The flow sampled exactly the bare loop's texts and built as many pairs, or BenchmarkError."""
    key = ["query_id", "candidate_idx", "text"]
    ours = pl.read_parquet(bare / "candidates.parquet").select(key).sort(key)
    theirs = pl.read_parquet(run / "stage1" / "candidates.parquet").select(key).sort(key)
    if not ours.equals(theirs):
        raise BenchmarkError(f"the bare loop's completions ({ours.height} rows) differ from {run}'s candidates "
                             f"({theirs.height} rows): the two sides did not do the same work")
    counts = [pl.read_parquet(folder / "pairs.parquet").height for folder in (bare, run / "stage1")]
    if counts[0] != counts[1]:
        raise BenchmarkError(f"pairs: the bare loop built {counts[0]}, {run} built {counts[1]}")


def median(samples: list[dict], column: str) -> float | None:
    values = [sample[column] for sample in samples if sample[column] is not None]
    return statistics.median(values) if values else None


def shown(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def report(results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    print(f"\nmedians of {args.rounds} round(s)\n")
    print("| side | wall s | start-up s | active s | tail s | CPU s | peak PSS MB | requests | max in flight |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for side in SIDES:
        values = [median(results[side], column) for column in COLUMNS]
        print(f"| {side} | " + " | ".join(shown(v, 0 if c in ("pss_mb", "requests", "max_in_flight") else 2)
                                          for v, c in zip(values, COLUMNS)) + " |")

    def ratio(side: str, base: str) -> float:  # median of the per-round ratios: rounds pair up
        return statistics.median(s["wall"] / b["wall"] for s, b in zip(results[side], results[base]))

    checks = [  # name, measured, target, unit, digits
        ("flow (running server) wall / bare wall", ratio(SIDES[1], "bare"), 1.10, "×", 2),
        ("flow (running server) process start → first request", median(results[SIDES[1]], "startup"), 3, " s", 2),
        ("flow (embedded server) wall / bare wall", ratio(SIDES[3], "bare"), 1.35, "×", 2),
        ("rerun wall / its first run's wall", ratio(SIDES[2], SIDES[1]), 0.10, "×", 2),
        ("rerun requests", median(results[SIDES[2]], "requests"), 0, "", 0),
        ("flow (running server) peak PSS, Prefect server excluded", median(results[SIDES[1]], "pss_mb"), 250, " MB", 0),
    ]
    print("\n| check | measured | target | |\n|---|---:|---:|---|")
    for name, value, target, unit, digits in checks:
        verdict = "PASS" if value is not None and value <= target else "MISS"
        print(f"| {name} | {shown(value, digits)}{unit} | ≤ {target:g}{unit} | {verdict} |")
    print("\nCPU: user + sys of each side's process and the descendants it waited for (RUSAGE_CHILDREN). Peak PSS: "
          "the process tree's, sampled every 0.1 s; the running Prefect server is not in it, the embedded one is.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=64, help="contexts (x 3 personas = queries)")
    parser.add_argument("--k", type=int, default=8, help="candidates per query (the request's n)")
    parser.add_argument("--tokens", type=int, default=32, help="max_new_tokens of every request")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (generation.max_concurrency)")
    parser.add_argument("--seconds-per-token", type=float, default=0.03, help="the simulated server's decode time")
    parser.add_argument("--margin", type=float, default=0.5, help="stage1.margin")
    parser.add_argument("--shard-size", type=int, default=8, help="stage1.shard_size")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four sides")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpus")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (configs, runs, logs)")
    parser.add_argument("--bare-job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_job is not None:
        return bare_job(args.bare_job, args.out)

    work = Path(tempfile.mkdtemp(prefix="mascot-overhead-"))
    chat = prefect = None
    try:
        chat_port, prefect_port = free_port(), free_port()
        chat = subprocess.Popen([sys.executable, str(REPO / "tests" / "chat_server.py"), "--port", str(chat_port),
                                 "--model", MODEL, "--seconds-per-token", str(args.seconds_per_token)],
                                start_new_session=True)
        server = f"http://127.0.0.1:{chat_port}"
        wait_healthy(f"{server}/health", chat, 30, "the chat server")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
            "WANDB_MODE": "offline", "WANDB_DIR": str(work / "wandb"), "HF_HUB_OFFLINE": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60"}
        (work / "wandb").mkdir()
        with open(work / "prefect-server.log", "w") as log:
            prefect = subprocess.Popen(
                [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port),
                 "--no-ui"],
                env=env | {"PREFECT_HOME": str(work / "prefect-server")}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        api = f"http://127.0.0.1:{prefect_port}/api"
        wait_healthy(f"{api}/health", prefect, 180, "the Prefect server")
        running = env | {"PREFECT_HOME": str(work / "prefect-client"), "PREFECT_API_URL": api}
        embedded = env | {"PREFECT_HOME": str(work / "prefect-embedded")}  # one database, reused by every round

        corpus = write_corpus(work / "corpus", args.contexts + args.contexts // 4 + 1, args.seed)
        queries = args.contexts * 3
        print(f"{args.contexts} contexts x 3 personas = {queries} queries, K={args.k}, {args.tokens} tokens at "
              f"{args.seconds_per_token:g} s/token, concurrency {args.concurrency}: the server alone needs "
              f"{-(-queries // args.concurrency) * args.tokens * args.seconds_per_token:.1f} s; work folder {work}")
        results: dict[str, list[dict]] = {side: [] for side in SIDES}
        for r in range(1, args.rounds + 1):
            bare, running_run, embedded_run = work / f"bare-{r}", f"r{r}-running", f"r{r}-embedded"
            configs = {name: write_config(work / f"config-{name}.yaml", args, corpus, chat_port, work / "cache" / name,
                                          work / "runs") for name in (bare.name, running_run, embedded_run)}
            sides = [(None, [sys.executable, __file__, "--bare-job", str(configs[bare.name]), "--out", str(bare)], env),
                     (running_run, flow_command(configs[running_run], running_run), running),
                     (running_run, flow_command(configs[running_run], running_run), running),  # the rerun
                     (embedded_run, flow_command(configs[embedded_run], embedded_run), embedded)]
            for side, (name, command, child_env) in zip(SIDES, sides, strict=True):
                log = work / f"round{r}-{SIDES.index(side)}-{side.split()[0]}.log"
                sample = run_side(command, child_env, log, server)
                results[side].append(sample)
                if name is not None:
                    same_work(bare, work / "runs" / name)
                print(f"round {r}: {side:<24} wall {sample['wall']:6.2f} s, {sample['requests']} requests", flush=True)
        report(results, args)
    except BenchmarkError as error:
        sys.exit(f"FAILED: {error}\n(work folder kept: {work})")
    finally:
        stop(prefect)
        stop(chat)
        if not args.keep and sys.exc_info()[0] is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.keep:
        print(f"\nwork folder kept: {work}")


if __name__ == "__main__":
    main()
