"""Latency of `mascot chat --web`: time to the first streamed token and to a whole group turn, for 1 and for 8
browser tabs talking at once.

    python benchmarks/chat.py [RUN_DIR (default runs/tiny)] [--sessions 1 8 --messages 8 --turns 2 --seed 0]

It serves the page's app (`cli.web.chat_app`) for the group trained in RUN_DIR (`make demo` writes runs/tiny:
the tiny profile's Speaker and Director, in this process) with uvicorn on a loopback port, and drives it as the
page does: each tab opens a conversation and sends `--messages` messages one after another, reading each
answer's server-sent events as they arrive. For every exchange it records, from just before the POST:

- first directive: when the Director's first directive arrived (the first companion's turn starts);
- first token: when the first `delta` event (a piece of the first companion's reply) arrived, or its `reply`
  event if that reply is empty;
- group turn: when the last `reply` event arrived, that is the whole answer, `--turns` companion turns,
  each a Director request and a streamed Speaker request.

The tabs of one run start together and talk concurrently; the in-process models decode their requests in one
batch. Each tab's conversation has its own seed (--seed plus the tab's number), its own messages, and is the
same at every run. A warm-up exchange, not counted, loads the models first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MESSAGES = ["I failed my driving test again this morning.", "My sister says I should just try harder.",
            "Honestly I am tired of feeling like the slow one.", "Maybe I will book another lesson next week.",
            "Money is tight, so every lesson counts.", "What would you do in my place?"]


def serve(app) -> tuple[str, object]:
    import socket

    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server


async def exchange(client, url: str, session: str, text: str, turns: int) -> tuple[float, float, float]:
    """Seconds to the first directive, to the first delta and to the last reply of one message's answer."""
    began, directed, first, last = time.perf_counter(), None, None, None
    async with client.stream("POST", f"{url}/api/sessions/{session}/messages",
                             json={"text": text, "turns": turns}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] == "directive" and directed is None:
                directed = time.perf_counter() - began
            if event["type"] in ("delta", "reply") and first is None:  # a reply may be empty: no delta
                first = time.perf_counter() - began
            if event["type"] == "reply":
                last = time.perf_counter() - began
            elif event["type"] == "error":
                raise RuntimeError(event["message"])
    return directed, first, last


async def tabs(url: str, count: int, messages: int, turns: int) -> list[tuple[float, float, float]]:
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        sessions = [(await client.post(f"{url}/api/sessions", json={})).json()["id"] for _ in range(count)]

        async def talk(index: int, session: str) -> list[tuple[float, float, float]]:
            return [await exchange(client, url, session, MESSAGES[(index + m) % len(MESSAGES)], turns)
                    for m in range(messages)]

        timings = await asyncio.gather(*(talk(i, s) for i, s in enumerate(sessions)))
        for session in sessions:
            await client.post(f"{url}/api/sessions/{session}/close", json={})
    return [timing for tab in timings for timing in tab]


def role(backend) -> str:
    adapter = getattr(backend, "adapter", None)
    return f"{backend.kind} {Path(backend.model).name}" + (f" + {Path(adapter).parent.name}/{Path(adapter).name}"
                                                           if adapter else "")


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"{statistics.median(values) * 1000:7.0f} ms [p90 {p90 * 1000:6.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", type=Path, default=REPO / "runs" / "tiny",
                        help="a run directory with a finished Stage 2 (default: runs/tiny, from make demo)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8], help="tabs talking at once, per run")
    parser.add_argument("--messages", type=int, default=8, help="messages each tab sends, one after another")
    parser.add_argument("--turns", type=int, default=2, help="companion turns per message")
    parser.add_argument("--seed", type=int, default=0, help="the first tab's seed; tab n has seed + n")
    args = parser.parse_args()

    from cli.web.chat_app import chat_app
    from mascot.chat.group import load_group

    group = load_group(args.run_dir, turns=args.turns)
    started = time.perf_counter()
    results = {}
    for count in args.sessions:
        url, server = serve(chat_app(group, max_sessions=max(args.sessions), seed=args.seed))
        asyncio.run(tabs(url, 1, 1, args.turns))  # warm-up: loads the models, not counted
        began = time.perf_counter()
        results[count] = asyncio.run(tabs(url, count, args.messages, args.turns)), time.perf_counter() - began
        server.should_exit = True
    print(f"group trained in {args.run_dir}: {', '.join(p.name for p in group.roster.active)}; "
          f"{args.turns} companion turns per message, {args.messages} messages per tab; "
          f"Speaker {role(group.speaker)}, Director {role(group.director)}")
    print(f"{'tabs':>4}  {'exchanges':>9}  {'first directive, median':>28}  {'first token, median':>28}  "
          f"{'group turn, median':>28}  {'turn x 1 tab':>12}  {'exchanges/s':>11}")
    base = statistics.median(last for *_, last in results[args.sessions[0]][0])
    for count, (timings, wall) in results.items():
        directed, firsts, lasts = (list(column) for column in zip(*timings, strict=True))
        print(f"{count:>4}  {len(timings):>9}  {summary(directed):>28}  {summary(firsts):>28}  {summary(lasts):>28}  "
              f"{statistics.median(lasts) / base:>11.2f}x  {len(timings) / wall:>11.2f}")
    print(f"({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
