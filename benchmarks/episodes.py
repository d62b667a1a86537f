"""Benchmark: Stage 2 episodes per second at a concurrency limit of 8 against a limit of 1.

    python benchmarks/episodes.py [--contexts 16 --latency 0.05 --branches 4 --block-turns 3 --rounds 2]

Starts the simulated chat server (tests/chat_server.py) in its own process, answering every
request after a fixed latency (`--latency` seconds, no per-token time), as a hosted API does.
Then, alternating the two limits over `--rounds` rounds, it generates the branched episodes of
`--contexts` contexts with the library's step (`mascot.stage2.branching.generate_shard`: every
episode in flight at once, the backend's limit bounding the requests in flight), each time with an
empty request cache. The Director, the Speaker and the simulated user all talk to that server.

It checks that both limits produced the same episodes, text for text, and prints the median wall
time, episodes per second, the requests and the most in flight the server saw, and the ratio of
episodes per second at 8 to 1 against the target (at least 3x).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMITS = (1, 8)
TARGET = 3.0


def http_json(url: str, post: bool = False) -> dict:
    request = urllib.request.Request(url, method="POST" if post else "GET")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def start_server(port: int, latency: float) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "chat_server.py"), "--port", str(port),
                               "--seconds-per-token", "0", "--seconds-per-request", str(latency)])
    deadline = time.monotonic() + 30
    while True:
        try:
            http_json(f"http://127.0.0.1:{port}/health")
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("the chat server did not start") from None
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=16, help="episodes per run (sample contexts, up to 40)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the server takes per request")
    parser.add_argument("--branches", type=int, default=4, help="branches per episode (M)")
    parser.add_argument("--block-turns", type=int, default=3, help="companion turns per block (N)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each limit, alternating")
    parser.add_argument("--port", type=int, default=8124, help="port of the chat server")
    args = parser.parse_args()

    from mascot.config import BackendConfig, DataConfig, EpisodeConfig
    from mascot.data.contexts import write_contexts
    from mascot.roster import load_roster, load_user_profiles
    from mascot.stage2.branching import CastSpec, Setting, generate_shard

    work = Path(tempfile.mkdtemp(prefix="mascot-episodes-"))
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": REPO / "configs" / "rosters" / "emotional_support.yaml",
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": args.contexts}})
    contexts = write_contexts(data, 0, work / "contexts.parquet")
    ids = contexts.read_parquet()["context_id"].to_list()
    episodes = EpisodeConfig(block_turns=args.block_turns, branches=args.branches)
    roster = load_roster(data.roster)
    users = load_user_profiles(REPO / "configs" / "users" / "big_five.yaml").profiles
    url = f"http://127.0.0.1:{args.port}"

    def setting(limit: int, cache: Path) -> Setting:
        backend = BackendConfig(kind="openai", model="sim-chat", base_url=f"{url}/v1", max_concurrency=limit,
                                params={"max_new_tokens": 16})
        cast = CastSpec(roster=roster, director=backend, speaker=backend, user=backend, profiles=users)
        return Setting(cast=cast, episodes=episodes, seed=0, contexts=contexts, requests=cache)

    server = start_server(args.port, args.latency)
    results: dict[int, list[dict]] = {limit: [] for limit in LIMITS}
    outputs: dict[int, str] = {}
    try:
        for round_ in range(args.rounds):
            for limit in LIMITS:
                http_json(f"{url}/stats/reset", post=True)
                cache = work / f"requests-{limit}-{round_}.sqlite"  # empty: every request goes to the server
                start = time.perf_counter()
                out = generate_shard(setting(limit, cache), ids, work / f"episodes-{limit}-{round_}.parquet")
                wall = time.perf_counter() - start
                stats = http_json(f"{url}/stats")
                results[limit].append({"wall": wall, "requests": stats["requests"],
                                       "max_in_flight": stats["max_in_flight"]})
                outputs.setdefault(limit, out.sha256)
                if out.sha256 != outputs[limit] or out.sha256 != outputs[LIMITS[0]]:
                    raise RuntimeError("the limits produced different episodes; the comparison would be unfair")
    finally:
        server.kill()

    print(f"{args.contexts} episodes of {args.block_turns}-turn blocks, {args.branches} branches; server latency "
          f"{args.latency:g} s per request; medians of {args.rounds} run(s) per limit")
    print(f"{'limit':>5} {'wall s':>8} {'episodes/s':>11} {'requests':>9} {'max in flight':>14}")
    rate = {}
    for limit in LIMITS:
        wall = statistics.median(r["wall"] for r in results[limit])
        rate[limit] = args.contexts / wall
        print(f"{limit:>5} {wall:>8.2f} {rate[limit]:>11.3f} {results[limit][0]['requests']:>9} "
              f"{max(r['max_in_flight'] for r in results[limit]):>14}")
    ratio = rate[8] / rate[1]
    print(f"episodes per second, limit 8 / limit 1: {ratio:.2f}x (target >= {TARGET:g}x: "
          f"{'met' if ratio >= TARGET else 'missed'})")


if __name__ == "__main__":
    main()
