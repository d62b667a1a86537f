"""Human preference: blind pairwise sheets for raters, and their ratings read back against a key.

A comparison is the automatic pairwise judge's (`mascot.evaluation.pairwise`): MASCOT's conversation
and a baseline's, on the same context and evaluation seed. `export_sheets` samples up to N of them
per baseline, shuffles their order, and puts MASCOT on side A in half of each baseline's items and
on side B in the other half, so a rater who prefers a position cannot favour a system. Given the
raters' ids, each rater gets a sheet of their own with the same comparisons, their own sides and their
own order (seeded by the export seed and the rater), so one rater's taste for a position or fatigue
late in a sheet does not fall on the same items for everyone. The sheets (`sheet.csv`, `sheet.html`)
name no system; the key that says which side is which is written apart from them, outside the folder
that goes to raters.

An item id is a hash of the run's conversations file, the export seed, the comparison, MASCOT's side
and (on a rater's own sheet) the rater. It is stable (the same export gives the same ids), a rating
can only ever be read with the side it was given, and a rater, who does not have the run's files,
cannot work the side out from it.

`import_ratings` reads rater files (item_id, rater, choice, comment), refusing every problem with its
file, line and field, and reports per baseline MASCOT's wins, ties and losses, its win rate with an
interval over contexts and raters crossed (`statistics.win_rate`), Krippendorff's alpha between raters
at the ordinal level (loss < tie < win, read from MASCOT's side) on the comparisons two or more rated,
the share of decisive choices that picked side A (position bias), and, where the evaluation judged
pairwise preferences, the share of ratings that agree with the pairwise judge's outcome.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from pydantic import BaseModel, ConfigDict, ValidationError

from mascot.artifacts import Artifact, RunDir, atomic_path, file_sha256, write_json, write_text
from mascot.data.contexts import read_contexts
from mascot.dialogue.turns import Turn, opening_query, opening_turns
from mascot.evaluation.conversations import of_training_seed, read_conversations, with_training_seed
from mascot.evaluation.human_sheet import Line, SheetItem, render_sheet_html
from mascot.evaluation.statistics import judge_agreement, win_rate
from mascot.evaluation.systems import SYSTEMS
from mascot.judges.group import speaker_label
from mascot.queries import request_seed
from mascot.roster import Roster, load_roster
from mascot.stats import crossed_clustered_mean

MASCOT = "mascot"
CHOICES = ("A", "B", "tie")
RATING_COLUMNS = ("item_id", "rater", "choice", "comment")
REQUIRED_COLUMNS = ("item_id", "rater", "choice")
SHEET_COLUMNS = ("item_id", "context", "conversation_a", "conversation_b", "rater", "choice", "comment")
AGREEMENT_LEVEL = "ordinal"  # a tie lies between preferring one side and preferring the other
# A rater id names a file (ratings-<rater>.csv) and a column value, so it is one short, plain word.
RATER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
RATER_RULE = "use 1 to 40 letters, digits, '.', '_' or '-', starting with a letter or digit"


class KeyItem(BaseModel):
    """What one blind item is: which system is on each side, and the comparison it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    system_a: str
    system_b: str
    context_id: str
    seed: int
    eval_set: str
    rater: str | None = None  # the rater whose own sheet shows this item; None on a sheet shared by all
    position: int | None = None  # its place on its sheet, from 1 (the key's JSON sorts items by id)

    @property
    def comparison(self) -> tuple[str, str, int]:
        """(baseline, context, seed): what is compared, whichever sheet and side show it."""
        return self.baseline, self.context_id, self.seed

    @property
    def baseline(self) -> str:
        return self.system_b if self.system_a == MASCOT else self.system_a

    @property
    def mascot_side(self) -> str:
        return "A" if self.system_a == MASCOT else "B"


class HumanKey(BaseModel):
    """key.json: kept back from raters; import reads their choices through it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run: str
    seed: int
    conversations_sha256: str
    items: dict[str, KeyItem]
    raters: list[str] | None = None  # one sheet per rater, in <sheets>/<rater>/; None: one sheet for all

    def raters_items(self, rater: str | None) -> dict[str, KeyItem]:
        """The items of one rater's sheet (every item when the sheet is shared), in the sheet's order."""
        mine = [(item_id, item) for item_id, item in self.items.items() if self.raters is None or item.rater == rater]
        return dict(sorted(mine, key=lambda pair: pair[1].position or 0))


@dataclass(frozen=True)
class Export:
    sheet_csv: Path  # the shared sheet, or the first rater's
    sheet_html: Path
    key: Path
    items: int  # comparisons (each rater's sheet shows every one of them)
    per_baseline: dict[str, int]
    rater_sheets: dict[str, Path]  # rater -> the folder of their own sheets; empty for a shared sheet


class HumanRatingsError(ValueError):
    """Bad input to export or import; `problems` holds one line per problem (file:line: field: message)."""

    def __init__(self, *problems: str):
        self.problems = list(problems)
        super().__init__("\n".join(problems))


def evaluation_artifact(run: RunDir, name: str) -> Artifact:
    """A finished evaluation's artifact (`eval/conversations`), checked against its recorded hash."""
    try:
        return run.recorded(name, "human preference sheets")
    except FileNotFoundError:
        raise FileNotFoundError(f"{run.root} has no {name} recorded in its manifest: human preference sheets "
                                "are made from a finished evaluation; run `mascot run evaluate` for this run "
                                "first") from None


def run_rosters(run: RunDir) -> tuple[Roster, Roster]:
    """The run's roster and single assistant, from the config its manifest records: the persona names the
    sheets show are those the evaluation used."""
    config = json.loads(run.manifest.read_text()).get("config") or {}
    paths = [(config.get("data") or {}).get("roster"), (config.get("eval") or {}).get("assistant")]
    if None in paths:
        raise FileNotFoundError(f"{run.manifest} names no data.roster and eval.assistant in its config, so the "
                                "speakers' names are unknown: is this a finished evaluation run?")
    return load_roster(paths[0]), load_roster(paths[1])


def choose_comparisons(pairs: list[tuple[str, str, int]], seed: int, per_baseline: int | None,
                       rater: str | None = None) -> list[tuple[str, str, int, str]]:
    """(baseline, context id, seed, MASCOT's side) of up to `per_baseline` comparisons per baseline, chosen by
    seed, MASCOT on side A in half of each baseline's (the odd one by seed), all in a seeded order. The
    comparisons depend on the seed only, so every rater rates the same ones; the sides and the order depend on
    the rater too, so each rater's sheet is randomised apart."""
    by_baseline: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for baseline, context_id, eval_seed in sorted(pairs):
        by_baseline[baseline].append((context_id, eval_seed))
    chosen = []
    whose = () if rater is None else ("rater", rater)
    for baseline, candidates in by_baseline.items():
        rng = random.Random(request_seed(seed, "human", baseline))
        picked = rng.sample(candidates, min(per_baseline or len(candidates), len(candidates)))
        if rater is not None:
            rng = random.Random(request_seed(seed, "human", baseline, *whose))
        half = len(picked) // 2
        sides = ["A"] * half + ["B"] * half + ([rng.choice("AB")] if len(picked) % 2 else [])
        rng.shuffle(sides)
        chosen += [(baseline, c, s, side) for (c, s), side in zip(picked, sides, strict=True)]
    random.Random(request_seed(seed, "human", "order", *whose)).shuffle(chosen)
    return chosen


def lines(turns: list[Turn], roster: Roster) -> list[Line]:
    return [Line(speaker_label(turn, roster), turn.text.strip() or "(empty)") for turn in turns]


def as_text(turns: list[Line]) -> str:
    return "\n".join(f"{line.speaker}: {line.text}" for line in turns)


def context_text(item: SheetItem) -> str:
    """The opening as sheet.csv shows it: a meeting's question first, when it has one."""
    return "\n".join([*([f"Question: {item.query}"] if item.query else []), as_text(item.context)])


def export_sheets(run_dir: Path, out: Path, key_path: Path, *, seed: int = 0, per_baseline: int | None = None,
                  baselines: list[str] | None = None, force: bool = False,
                  raters: list[str] | None = None) -> Export:
    """Write the blind sheets to `out` and the key to `key_path` (outside `out`): one sheet for all, or, given
    `raters`, one per rater in `out`/<rater>/ with that rater's own sides and order."""
    run = RunDir(run_dir)
    if raters is not None:
        problems = [f"--raters: {why}" for rater in raters if (why := rater_problem(rater)) is not None]
        problems += [f"--raters: {rater!r} is named twice; each rater gets one sheet"
                     for rater, n in Counter(raters).items() if n > 1]
        if not raters:
            problems.append("--raters: no rater named; name one or more, or leave it out for one shared sheet")
        if problems:
            raise HumanRatingsError(*problems)
    out, key_path = out.resolve(), key_path.resolve()
    if key_path.is_relative_to(out):
        raise HumanRatingsError(f"--key {key_path}: the key is inside {out}, the folder that goes to raters; it "
                                "says which side is MASCOT, so keep it elsewhere")
    if per_baseline is not None and per_baseline < 1:
        raise HumanRatingsError(f"--per-baseline {per_baseline}: expected at least 1 item per baseline")
    conversations = evaluation_artifact(run, "eval/conversations")
    contexts_artifact = evaluation_artifact(run, "eval/contexts")
    roster, assistant = run_rosters(run)
    played = of_training_seed(read_conversations(conversations))  # MASCOT's first training seed
    pairs = [(system, c, s) for system, c, s in played if system != MASCOT and (MASCOT, c, s) in played]
    available = sorted({baseline for baseline, _, _ in pairs})
    if not available:
        raise HumanRatingsError(f"{conversations.path}: no baseline shares a context and seed with MASCOT, so "
                                "there is nothing to compare")
    unknown = sorted(set(baselines or []) - set(available))
    if unknown:
        raise HumanRatingsError(f"--baselines: {', '.join(unknown)} played no conversation to compare with "
                                f"MASCOT's; expected some of: {', '.join(available)}")
    pairs = [pair for pair in pairs if not baselines or pair[0] in baselines]
    contexts = read_contexts(contexts_artifact)
    eval_sets = dict(contexts_artifact.read_parquet().select("context_id", "eval_set").iter_rows())

    sheets: dict[str | None, list[SheetItem]] = {}
    key_items: dict[str, KeyItem] = {}
    for rater in raters or [None]:
        sheet = sheets.setdefault(rater, [])
        for position, (baseline, context_id, eval_seed, side) in enumerate(
                choose_comparisons(pairs, seed, per_baseline, rater), 1):
            whose = "" if rater is None else f"\x1f{rater}"
            item_id = hashlib.sha256(f"{conversations.sha256}\x1f{seed}\x1f{baseline}\x1f{context_id}\x1f{eval_seed}"
                                     f"\x1f{side}{whose}".encode()).hexdigest()[:12]
            systems = (MASCOT, baseline) if side == "A" else (baseline, MASCOT)
            if item_id in key_items:
                raise RuntimeError("two comparisons were given the same item id; export again with another --seed")
            key_items[item_id] = KeyItem(system_a=systems[0], system_b=systems[1], context_id=context_id,
                                         seed=eval_seed, eval_set=eval_sets[context_id], rater=rater,
                                         position=position)
            sheet.append(sheet_item(item_id, key_items[item_id], played, contexts, roster, assistant))
    key = HumanKey(run=run.root.name, seed=seed, conversations_sha256=conversations.sha256, items=key_items,
                   raters=raters)
    if key_path.exists() and not force and read_key(key_path) != key:
        raise HumanRatingsError(f"{key_path} already holds the key of another export; ratings of sheets sent out "
                                "with it could no longer be read. Pass --force to replace it, or --key elsewhere")

    # The key first: sheets without their key could never be read back.
    write_json(key.model_dump(mode="json"), key_path)
    written = {rater: write_sheet(sheet, out if rater is None else out / rater, rater)
               for rater, sheet in sheets.items()}
    counts = Counter(item.baseline for item in key.raters_items((raters or [None])[0]).values())
    sheet_csv, sheet_html = next(iter(written.values()))
    return Export(sheet_csv, sheet_html, key_path, sum(counts.values()), dict(sorted(counts.items())),
                  {rater: out / rater for rater in raters or []})


def write_sheet(sheet: list[SheetItem], folder: Path, rater: str | None) -> tuple[Path, Path]:
    """sheet.csv and sheet.html of one sheet; a rater's own sheet has their id filled in."""
    sheet_csv, sheet_html = folder / "sheet.csv", folder / "sheet.html"
    with atomic_path(sheet_csv) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(SHEET_COLUMNS)
        for item in sheet:
            writer.writerow([item.item_id, context_text(item), as_text(item.a), as_text(item.b), rater or "", "", ""])
    sheet_id = hashlib.sha256("".join(item.item_id for item in sheet).encode()).hexdigest()[:12]
    write_text(render_sheet_html(sheet, sheet_id, rater), sheet_html)
    return sheet_csv, sheet_html


def sheet_item(item_id: str, item: KeyItem, played: dict, contexts: dict, roster: Roster,
               assistant: Roster) -> SheetItem:
    """One comparison as raters see it: the opening, then each side's conversation, speakers by persona name."""
    a, b = (lines(played[(system, item.context_id, item.seed)], roster if SYSTEMS[system].group else assistant)
            for system in (item.system_a, item.system_b))
    opening = opening_turns(contexts[item.context_id])
    return SheetItem(item_id, opening_query(opening), lines(opening, roster), a, b)


def key_conversations(run: RunDir, key: HumanKey, key_path: Path) -> Artifact:
    """The run's conversations, once they are those the key's sheets were exported from: a key of another run (or
    of this run before its evaluation was played again) would read choices against the wrong sides."""
    conversations = evaluation_artifact(run, "eval/conversations")
    if conversations.sha256 != key.conversations_sha256:
        raise HumanRatingsError(
            f"{key_path}: conversations_sha256: the key belongs to the sheets of run '{key.run}' (conversations sha256 "
            f"{key.conversations_sha256}), but {conversations.path} of run '{run.root.name}' holds other conversations "
            f"(sha256 {conversations.sha256}): use the key exported from this run, or export the sheets again "
            "(`mascot eval export-human`)")
    return conversations


def sheet_items(run_dir: Path, key_path: Path, rater: str | None = None) -> list[SheetItem]:
    """The items of the export that wrote `key_path` (of `rater`'s own sheet, where it made one per rater), in the
    sheet's order, rebuilt from the run (the rating page serves these; they name no system)."""
    run, key = RunDir(run_dir), read_key(key_path)
    if key.raters is not None and rater not in key.raters:
        raise HumanRatingsError(f"{key_path}: raters: this export made one sheet per rater "
                                f"({', '.join(key.raters)}); " + ("pass --rater with one of them" if rater is None
                                                                  else f"{rater!r} is not one of them"))
    if key.raters is None and rater is not None:
        raise HumanRatingsError(f"--rater {rater}: {key_path} is of one sheet shared by every rater; leave --rater "
                                "out (the page asks for the rater's id)")
    conversations = key_conversations(run, key, key_path)
    roster, assistant = run_rosters(run)
    played = of_training_seed(read_conversations(conversations))
    contexts = read_contexts(evaluation_artifact(run, "eval/contexts"))
    return [sheet_item(item_id, item, played, contexts, roster, assistant)
            for item_id, item in key.raters_items(rater).items()]


def write_rater_file(path: Path, rater: str, ratings: dict[str, tuple[str, str]]) -> None:
    """One rater's ratings (item id -> choice, comment) as the CSV `import_ratings` reads, replaced atomically."""
    with atomic_path(path) as temporary, temporary.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(RATING_COLUMNS)
        writer.writerows([item_id, rater, choice, comment] for item_id, (choice, comment) in ratings.items())


def read_key(path: Path) -> HumanKey:
    if not path.exists():
        raise FileNotFoundError(f"no key file at {path}: run `mascot eval export-human RUN` first (it writes the "
                                "key beside the sheets' folder), or pass --key with the key of the sheets rated")
    try:
        return HumanKey.model_validate_json(path.read_text())
    except ValidationError as exc:
        problems = [f"{path}: {'.'.join(map(str, e['loc'])) or 'key'}: {e['msg']}" for e in exc.errors()]
        raise HumanRatingsError(*problems) from None


@dataclass(frozen=True)
class Rating:
    item_id: str
    rater: str
    choice: str  # "A", "B" or "tie"
    comment: str
    where: str  # file:line, for messages


@dataclass(frozen=True)
class RatingsFile:
    path: Path
    sha256: str
    ratings: int
    blank_rows: int  # rows with no rater, choice or comment: items left unrated on a filled-in sheet.csv


def csv_records(path: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """A CSV file's header and its non-empty records, each with the line it starts on (a quoted field may span
    lines). utf-8-sig: a CSV saved by a spreadsheet may start with a byte-order mark."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        records = []
        while True:
            line = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                return header, records
            if any(cell.strip() for cell in row):
                records.append((line, row))


def rater_problem(rater: str) -> str | None:
    """Why a rater id is refused (the rating page's rule, which names a file after it), or None."""
    if not rater:
        return "empty; every rating needs its rater's id"
    if not RATER_ID.match(rater):
        return f"{rater!r}: {RATER_RULE}"
    return None


def rating_problems(value: dict[str, str], where: str, key: HumanKey, first_seen: dict[tuple[str, str], str]
                    ) -> list[str]:
    """What is wrong with one record of a ratings file (none when it is a rating). `first_seen` holds where each
    (rater, item) read so far was rated; this record is added to it."""
    problems = []
    if not value["item_id"]:
        problems.append(f"{where}: item_id: empty; expected the id of an item of the sheet")
    elif value["item_id"] not in key.items:
        problems.append(f"{where}: item_id: {value['item_id']!r} is not an item of this key's sheets")
    elif (owner := key.items[value["item_id"]].rater) is not None and value["rater"] and value["rater"] != owner:
        problems.append(f"{where}: item_id: {value['item_id']} is on rater {owner!r}'s own sheet, rated here by "
                        f"{value['rater']!r}; each rater rates their own sheet, whose sides and order are theirs")
    if (why := rater_problem(value["rater"])) is not None:
        problems.append(f"{where}: rater: {why}")
    if value["choice"].lower() not in {c.lower() for c in CHOICES}:
        problems.append(f"{where}: choice: {value['choice']!r}; expected A, B or tie")
    rated = (value["rater"], value["item_id"])
    if value["rater"] and rated in first_seen:
        problems.append(f"{where}: item_id: rater {value['rater']!r} rated item {value['item_id']} again (first at "
                        f"{first_seen[rated]}); keep one rating per rater and item")
    first_seen.setdefault(rated, where)
    return problems


def read_ratings(paths: list[Path], key: HumanKey) -> tuple[list[Rating], list[RatingsFile]]:
    """Every rating of every file, or HumanRatingsError with every problem found (file:line: field: message)."""
    problems, ratings, files = [], [], []
    first_seen: dict[tuple[str, str], str] = {}
    by_content: dict[str, Path] = {}  # a file given twice, or a copy of one, would count its ratings twice
    by_lower = {c.lower(): c for c in CHOICES}
    for path in paths:
        if not path.is_file():
            problems.append(f"{path}: " + ("a folder; expected a ratings CSV file" if path.is_dir()
                                           else "no such ratings file"))
            continue
        sha256 = file_sha256(path)
        if sha256 in by_content:
            same = "given twice" if by_content[sha256] == path else f"the same content as {by_content[sha256]}"
            problems.append(f"{path}: {same} (sha256 {sha256}); each ratings file counts once, so give it once")
            continue
        by_content[sha256] = path
        try:
            header, records = csv_records(path)
        except (UnicodeDecodeError, csv.Error) as exc:
            problems.append(f"{path}: not a UTF-8 CSV file ({exc}); save it as CSV UTF-8")
            continue
        missing = [name for name in REQUIRED_COLUMNS if name not in header]
        if missing:
            problems.append(f"{path}:1: missing column(s) {', '.join(missing)}; expected a header with "
                            f"{', '.join(RATING_COLUMNS)} (comment optional)")
            continue
        column = {name: header.index(name) for name in RATING_COLUMNS if name in header}
        count = blank = 0
        for line, row in records:
            value = {name: row[i].strip() if (i := column.get(name)) is not None and i < len(row) else ""
                     for name in RATING_COLUMNS}
            if not (value["rater"] or value["choice"] or value["comment"]):
                blank += 1
                continue
            where = f"{path}:{line}"
            found = rating_problems(value, where, key, first_seen)
            problems += found
            if not found:
                count += 1
                ratings.append(Rating(value["item_id"], value["rater"], by_lower[value["choice"].lower()],
                                      value["comment"], where))
        files.append(RatingsFile(path, sha256, count, blank))
    if problems:
        raise HumanRatingsError(*problems)
    if not ratings:
        raise HumanRatingsError(f"{', '.join(map(str, paths))}: no ratings (every row is blank)")
    return ratings, files


def outcome(rating: Rating, item: KeyItem) -> float:
    """The rating read from MASCOT's side: a win (1), a tie (0.5) or a loss (0)."""
    return 0.5 if rating.choice == "tie" else float(rating.choice == item.mascot_side)


def rater_agreement(outcomes: dict[str, dict[tuple, float]]) -> dict:
    """Krippendorff's alpha (ordinal) between raters over the comparisons two or more of them rated (on one shared
    sheet or on their own sheets, whatever the sides), with the reason when it cannot be computed."""
    raters_of: Counter[tuple] = Counter(item for by_item in outcomes.values() for item in by_item)
    shared = {rater: {"|".join(map(str, item)): value for item, value in by_item.items() if raters_of[item] >= 2}
              for rater, by_item in outcomes.items()}
    shared = {rater: by_item for rater, by_item in shared.items() if by_item}
    result = judge_agreement(shared, level=AGREEMENT_LEVEL)
    agreement = {"alpha": result["alpha"], "raters": result["judges"], "items": result["items"],
                 "level": result["level"], "method": result["method"], "reason": None}
    if len(outcomes) < 2:
        agreement["reason"] = "fewer than two raters"
    elif result["items"] < 2:
        agreement["reason"] = f"{result['items']} item(s) rated by two or more raters; alpha needs at least two"
    elif result["alpha"] is None:
        agreement["reason"] = "every rating of the shared items is the same, so alpha is undefined (0/0)"
    return agreement


def crossed_share(values: list[float], contexts: list[str], raters: list[str], confidence: float, resamples: int,
                  seed: int) -> dict:
    """A share over ratings with its interval over contexts and raters crossed; None where no rating counts."""
    interval = crossed_clustered_mean(values, contexts, raters, confidence, resamples, seed)
    return {"share": interval["value"], "n": interval["n"], "ci_low": interval["ci_low"],
            "ci_high": interval["ci_high"], "confidence": confidence,
            "interval": "percentile bootstrap over contexts and raters, crossed"}


def judge_outcomes(preferences: pl.DataFrame | None) -> dict[tuple[str, str, int], float]:
    """The pairwise judge's outcome of each comparison both of its orders judged, read from MASCOT's side as
    `pairwise.preference_results` reads it: a win or a loss where both orders agree, else a tie."""
    if preferences is None or preferences.is_empty():
        return {}
    # The sheets show MASCOT's first training seed (export_sheets), so the judge's verdicts on it are compared.
    preferences = with_training_seed(preferences).filter(pl.col("training_seed") == 0)
    wide = preferences.pivot(on="order", index=["baseline", "context_id", "seed"], values="mascot")
    if not {"mascot_first", "mascot_second"} <= set(wide.columns):
        return {}
    judged = wide.drop_nulls(["mascot_first", "mascot_second"])
    return {(b, c, s): (first if first == second and first != 0.5 else 0.5)
            for b, c, s, first, second in judged.select("baseline", "context_id", "seed", "mascot_first",
                                                        "mascot_second").iter_rows()}


def human_results(ratings: list[Rating], key: HumanKey, confidence: float = 0.95, resamples: int = 2000,
                  seed: int = 0, preferences: pl.DataFrame | None = None,
                  clusters: dict[str, str] | None = None) -> list[dict]:
    """Per baseline: raters, ratings, MASCOT's wins, ties and losses and win rate (ties count half; every rating
    counts, the interval resamples clusters of contexts, a meeting say, and raters crossed), the raters'
    agreement, the share of decisive choices that picked side A, and the share of ratings that agree with the
    pairwise judge."""
    cluster = clusters or {}
    by_baseline: dict[str, list[Rating]] = defaultdict(list)
    for rating in ratings:
        by_baseline[key.items[rating.item_id].baseline].append(rating)
    in_sheet = Counter(item.baseline for item in key.raters_items((key.raters or [None])[0]).values())
    judged = judge_outcomes(preferences)
    results = []
    for baseline in sorted(by_baseline):
        rated = by_baseline[baseline]
        items = [key.items[r.item_id] for r in rated]
        outcomes = [outcome(r, item) for r, item in zip(rated, items, strict=True)]
        contexts, raters = [cluster.get(item.context_id, item.context_id) for item in items], [r.rater for r in rated]
        per_rater: dict[str, dict[tuple, float]] = defaultdict(dict)
        for rating, item, value in zip(rated, items, outcomes, strict=True):
            per_rater[rating.rater][item.comparison] = value
        decisive = [(float(r.choice == "A"), c, who) for r, c, who in zip(rated, contexts, raters, strict=True)
                    if r.choice != "tie"]
        with_judge = [(float(value == judged[item.comparison]), cluster.get(item.context_id, item.context_id), r.rater)
                      for r, item, value in zip(rated, items, outcomes, strict=True) if item.comparison in judged]
        contexts_rated = len({item.context_id for item in items})
        results.append({"baseline": baseline, "raters": len(per_rater), "ratings": len(rated),
                        "items": len({item.comparison for item in items}), "items_in_sheet": in_sheet[baseline],
                        "seeds": len({item.seed for item in items}),
                        **win_rate(outcomes, contexts, confidence, resamples, seed, raters=raters),
                        "clusters": len(set(contexts)), "contexts": contexts_rated,
                        "agreement": rater_agreement(per_rater),
                        "side_a_share": crossed_share(*map(list, zip(*decisive, strict=True)), confidence, resamples,
                                                      seed) if decisive else None,
                        "judge_agreement": crossed_share(*map(list, zip(*with_judge, strict=True)), confidence,
                                                         resamples, seed) if with_judge else None})
    return results


def context_clusters(run: RunDir) -> dict[str, str]:
    """Each evaluation context's cluster (its meeting, say), where eval/contexts.parquet records them."""
    frame = evaluation_artifact(run, "eval/contexts").read_parquet()
    return dict(frame.select("context_id", "cluster").iter_rows()) if "cluster" in frame.columns else {}


def recorded_preferences(run: RunDir) -> pl.DataFrame | None:
    """The evaluation's pairwise judgments, where it judged any (`eval.pairwise`)."""
    try:
        return run.recorded("eval/preferences", "human-judge agreement").read_parquet()
    except FileNotFoundError:
        return None


def import_ratings(run_dir: Path, paths: list[Path], key_path: Path, out: Path, confidence: float = 0.95,
                   resamples: int = 2000) -> dict:
    """Read the rater files against the key and write `out` (human_results.json); nothing is written on error."""
    key = read_key(key_path)
    run = RunDir(run_dir)
    key_conversations(run, key, key_path)
    ratings, files = read_ratings(paths, key)
    summary = {"run": str(run_dir), "key": {"path": str(key_path), "sha256": file_sha256(key_path)},
               "ratings_files": [{"path": str(f.path), "sha256": f.sha256, "ratings": f.ratings,
                                  "blank_rows": f.blank_rows} for f in files],
               "raters": sorted({r.rater for r in ratings}), "confidence": confidence,
               "sheets": "one per rater" if key.raters is not None else "one shared by every rater",
               "outcome": "MASCOT's side: win 1, tie 0.5, loss 0",
               "side_a_share": "the share of decisive (A or B) choices that picked side A; 0.5 without position bias",
               "judge_agreement": "the share of ratings whose outcome equals the pairwise judge's for the same "
                                  "comparison",
               "results": human_results(ratings, key, confidence, resamples, seed=key.seed,
                                        preferences=recorded_preferences(run), clusters=context_clusters(run))}
    write_json(summary, out)
    return summary
