"""How well the chat's crisis guard screens: recall per crisis category and false alarms, with Wilson intervals.

    python benchmarks/safety.py [--split heldout|dev|all] [--rules FILE] [--moderation-recall 0.8]
                                [--moderation-false-alarms 0.05] [--moderation-failures 0.02]

It reads tests/data/crisis_screening.tsv (by default its `heldout` rows, which no rule was written from; between two
blind sets there are none, and it says so) and measures two guards on it:

1. **the rules alone** (`mascot/chat/safety.yaml`, or `--rules`);
2. **rules + moderation**: the same rules, with the `llama_guard` moderation layer asking a loopback server that
   speaks Llama Guard 3's completions format (tests/chat_server.py). That server is not a model: it is a noisy
   oracle that knows each message's label and flags a crisis message with probability `--moderation-recall`, a
   near-miss or ordinary one with `--moderation-false-alarms`, and fails (HTTP 500) for `--moderation-failures`
   of them, seeded by the message. So its figures show what the union of the two layers and failing closed do,
   not how good a real moderation model is.

It prints, for each guard, the recall per crisis category and in all, and the false-alarm rate per near-miss
category, on all near-misses and on ordinary messages, each as k/n with its 95% Wilson interval; then the rules'
misses and false alarms, message by message.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from chat_server import ERROR, SAFE, SELF_HARM, make_app
from loopback_servers import serve

from mascot.chat.moderation import Moderation
from mascot.chat.safety import DEFAULT_RULES, crisis_rules, load_rules, screen
from mascot.chat.screening import Measurement, measure, read_screening_set
from mascot.config import ModerationConfig

SCREENING_SET = REPO / "tests" / "data" / "crisis_screening.tsv"


def draw(message: str, salt: str) -> float:
    """A number in [0, 1) fixed by the message: the oracle's coin, the same on every run."""
    return int.from_bytes(hashlib.sha256(f"{salt}\0{message}".encode()).digest()[:8], "big") / 2**64


def noisy_oracle(labels: dict[str, str], recall: float, false_alarms: float, failures: float):
    def decide(message: str) -> str:
        if draw(message, "fail") < failures:
            return ERROR
        rate = recall if labels[message] == "crisis" else false_alarms
        return SELF_HARM if draw(message, "flag") < rate else SAFE

    return decide


def table(title: str, measurement: Measurement) -> None:
    print(f"\n{title}")
    print(f"  {'':<34} {'flagged':>24}")
    for label, heading in (("crisis", "recall"), ("near_miss", "false alarms"), ("ordinary", "false alarms")):
        for (row_label, category), rate in sorted(measurement.by_category.items()):
            if row_label == label and label != "ordinary":
                print(f"  {label + ' / ' + category:<34} {rate!s:>24}")
        print(f"  {label + ', all (' + heading + ')':<34} {measurement.rate(label)!s:>24}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=["heldout", "dev", "all"], default="heldout",
                        help="which rows to measure (default: heldout, the rows no rule was written from)")
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES, help="a rules file (default: the shipped one)")
    parser.add_argument("--moderation-recall", type=float, default=0.8)
    parser.add_argument("--moderation-false-alarms", type=float, default=0.05)
    parser.add_argument("--moderation-failures", type=float, default=0.02)
    args = parser.parse_args()

    rules = load_rules(args.rules)
    rows = [row for row in read_screening_set(SCREENING_SET) if args.split in ("all", row.split)]
    if not rows:
        # Between two blind held-out sets the file has none: the last one was read to write rules, so it is dev.
        parser.exit(2, f"{SCREENING_SET.relative_to(REPO)} has no {args.split} rows (a spent held-out set is moved "
                       f"to dev, and a new blind one replaces it); measure the dev rows with --split dev\n")
    labels = {row.message: row.label for row in rows}
    print(f"{len(rows)} messages ({args.split}) from {SCREENING_SET.relative_to(REPO)}; rules {args.rules}")

    alone = measure(rows, lambda message: bool(crisis_rules(message, rules)))
    table("rules alone", alone)

    oracle = noisy_oracle(labels, args.moderation_recall, args.moderation_false_alarms, args.moderation_failures)
    with serve(make_app(moderator=oracle)) as url:
        layer = Moderation(ModerationConfig(kind="llama_guard", model="llama-guard-3", base_url=f"{url}/v1",
                                            max_retries=0))
        verdicts = {row.message: (await screen(row.message, rules, moderation=layer)).crisis for row in rows}
    both = measure(rows, verdicts.__getitem__)
    table(f"rules + moderation (a loopback noisy oracle: recall {args.moderation_recall:g}, false alarms "
          f"{args.moderation_false_alarms:g}, failures {args.moderation_failures:g}, failing closed)", both)

    print("\nthe rules' misses:" if alone.misses else "\nthe rules missed no crisis message")
    for row in alone.misses:
        print(f"  line {row.line} [{row.category}] {row.message}")
    print("the rules' false alarms:" if alone.false_alarms else "the rules raised no false alarm")
    for row in alone.false_alarms:
        print(f"  line {row.line} [{row.label}/{row.category}] {row.message}")


if __name__ == "__main__":
    asyncio.run(main())
