"""Measuring a crisis guard on a labelled set of messages: recall per crisis category and false alarms, each with
a Wilson interval.

The set is a tab-separated file (`tests/data/crisis_screening.tsv`, with its own header comments): `split`
(`dev`, read while writing rules, or `heldout`, read only by the measurement), `label` (`crisis`, `near_miss`,
`ordinary`), `category` and `message`. `benchmarks/safety.py` prints the measurement, and a test holds the
shipped rules to their floor; both read it through here, so they count the same way.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from mascot.stats import proportion

LABELS = ("crisis", "near_miss", "ordinary")
SPLITS = ("dev", "heldout")
COLUMNS = ["split", "label", "category", "message"]


@dataclass(frozen=True)
class ScreeningRow:
    line: int
    split: str
    label: str
    category: str
    message: str


class ScreeningSetError(ValueError):
    """A screening file that cannot be read; the message names the file, the line and the field."""


def read_screening_set(path: Path) -> list[ScreeningRow]:
    path = Path(path)
    lines = [(number, line) for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if line.strip() and not line.startswith("#")]
    if not lines or lines[0][1].split("\t") != COLUMNS:
        raise ScreeningSetError(f"{path}: the first line that is not a comment must be the header "
                                f"{chr(9).join(COLUMNS)!r}")
    rows = []
    for number, fields in zip((n for n, _ in lines[1:]),
                              csv.reader((line for _, line in lines[1:]), delimiter="\t", quoting=csv.QUOTE_NONE)):
        if len(fields) != len(COLUMNS):
            raise ScreeningSetError(f"{path}:{number}: expected {len(COLUMNS)} tab-separated fields, got {len(fields)}")
        row = ScreeningRow(number, *fields)
        for field, allowed in (("split", SPLITS), ("label", LABELS)):
            if getattr(row, field) not in allowed:
                raise ScreeningSetError(f"{path}:{number}: {field} is {getattr(row, field)!r}; expected one of "
                                        f"{', '.join(allowed)}")
        if not row.message.strip() or not row.category.strip():
            raise ScreeningSetError(f"{path}:{number}: empty category or message")
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Rate:
    """k of n, with its Wilson 95% interval (`mascot.stats.proportion`)."""

    k: int
    n: int

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else float("nan")

    def __str__(self) -> str:
        share = proportion(self.k, self.n)
        if share["value"] is None:
            return f"{self.k}/{self.n}"
        return f"{self.k}/{self.n} = {share['value']:.0%} [{share['ci_low']:.0%}, {share['ci_high']:.0%}]"


@dataclass(frozen=True)
class Measurement:
    """How a guard did on a set: recall on crisis rows, false alarms on the others, by category and in all."""

    by_category: dict[tuple[str, str], Rate]  # (label, category) -> flagged rows of that category
    misses: list[ScreeningRow]  # crisis rows not flagged
    false_alarms: list[ScreeningRow]  # near-miss and ordinary rows flagged

    def rate(self, label: str) -> Rate:
        rates = [rate for (row_label, _), rate in self.by_category.items() if row_label == label]
        return Rate(sum(r.k for r in rates), sum(r.n for r in rates))


def measure(rows: Iterable[ScreeningRow], flags: Callable[[str], bool]) -> Measurement:
    """Run `flags` (True: the guard treats the message as a crisis) on every row, and count."""
    counts: dict[tuple[str, str], list[int]] = {}
    misses, false_alarms = [], []
    for row in rows:
        flagged = flags(row.message)
        count = counts.setdefault((row.label, row.category), [0, 0])
        count[0] += flagged
        count[1] += 1
        if row.label == "crisis" and not flagged:
            misses.append(row)
        elif row.label != "crisis" and flagged:
            false_alarms.append(row)
    return Measurement({key: Rate(k, n) for key, (k, n) in counts.items()}, misses, false_alarms)
