"""Human preference sheets: blind, balanced, self-contained exports, and ratings read back against the key,
with the win rate and the raters' agreement worked out by hand."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import polars as pl
import pytest
from test_cli import REPO
from typer.testing import CliRunner

from cli.main import app
from mascot.artifacts import RunDir, write_json, write_parquet
from mascot.config import DataConfig
from mascot.data.contexts import write_contexts
from mascot.dialogue.episodes import turn_row
from mascot.dialogue.turns import Turn
from mascot.evaluation.conversations import CONVERSATION_SCHEMA, write_eval_contexts
from mascot.evaluation.human import HumanRatingsError, export_sheets, import_ratings, read_key, sheet_items
from mascot.evaluation.pairwise import PREFERENCE_SCHEMA
from mascot.evaluation.systems import SYSTEMS

ROSTER = REPO / "configs" / "rosters" / "emotional_support.yaml"
ASSISTANT = REPO / "configs" / "rosters" / "assistant_emotional_support.yaml"
# A word only each system's conversations hold, so a test can tell which side is which without the key.
TOKENS = {"mascot": "kiwi", "zero_shot": "plum", "multi_agent": "fig"}
INJECTION = '<script>alert("owned")</script>'
runner = CliRunner()


def conversation(system: str, context: int) -> list[Turn]:
    token = f"{TOKENS[system]}{context}"
    if SYSTEMS[system].group:
        return [Turn("anchor", f"That sounds hard ({token})."), Turn("catalyst", f"What would help? {token}"),
                Turn("user", "Maybe a walk.", role="user"), Turn("beacon", f"A walk is a fine start, {token}.")]
    opening = f"I hear you {token}. {INJECTION}" if system == "zero_shot" and context == 0 else f"I hear you {token}."
    return [Turn("assistant", opening), Turn("user", "Thanks.", role="user"), Turn("assistant", f"Anytime {token}.")]


def make_run(tmp_path: Path, contexts: int = 3, seeds: tuple[int, ...] = (0,)) -> Path:
    """A finished evaluation's run directory, as far as the sheets read it: the manifest's rosters and recorded
    eval/contexts.parquet and eval/conversations.parquet, in their real schemas."""
    run_dir = tmp_path / "run"
    data = DataConfig.model_validate({
        "domain": "emotional_support", "roster": ROSTER, "held_out_fraction": 0.5,
        "corpus": {"source": "empathetic_dialogues", "path": "samples:empathetic_dialogues", "limit": 2 * contexts}})
    stage1 = write_contexts(data, 0, tmp_path / "stage1_contexts.parquet")
    eval_contexts = write_eval_contexts(data, stage1, 0, False, run_dir / "eval" / "contexts.parquet")
    ids = eval_contexts.read_parquet()["context_id"].to_list()
    assert len(ids) == contexts
    rows = []
    for system in TOKENS:
        for seed in seeds:
            for index, context_id in enumerate(ids):
                for k, turn in enumerate(conversation(system, index)):
                    stored = turn_row(turn)
                    stored["request_seed"] = stored.pop("seed")
                    rows.append({"system": system, "context_id": context_id, "seed": seed, "user_profile": None,
                                 "block": 0, "turn_idx": 1 + k, **stored, "samples": None, "reasoning_marked": None})
    played = write_parquet(pl.DataFrame(rows, schema=CONVERSATION_SCHEMA), run_dir / "eval" / "conversations.parquet")
    write_json({"config": {"data": {"roster": str(ROSTER)}, "eval": {"assistant": str(ASSISTANT)}}},
               run_dir / "manifest.json")
    RunDir(run_dir).record({"eval/contexts": eval_contexts, "eval/conversations": played})
    return run_dir


def export(run_dir: Path, **options):
    return export_sheets(run_dir, run_dir / "eval" / "human", run_dir / "eval" / "human_key.json", **options)


def sheet_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def write_ratings(path: Path, rows: list[tuple[str, ...]], header=("item_id", "rater", "choice", "comment")) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_the_sheets_name_no_system_and_mascot_sits_on_each_side_half_the_time(tmp_path):
    run_dir = make_run(tmp_path, contexts=4, seeds=(0, 1))
    result = export(run_dir)
    key = read_key(result.key)
    assert result.items == 16 and result.per_baseline == {"multi_agent": 8, "zero_shot": 8}
    assert result.key.parent == run_dir / "eval" and not result.key.is_relative_to(result.sheet_csv.parent)
    for baseline in ("zero_shot", "multi_agent"):
        sides = [item.mascot_side for item in key.items.values() if item.baseline == baseline]
        assert sorted(sides) == ["A"] * 4 + ["B"] * 4, "balanced within each baseline"
    rows = sheet_rows(result.sheet_csv)
    assert list(rows[0]) == ["item_id", "context", "conversation_a", "conversation_b", "rater", "choice", "comment"]
    assert sorted(r["item_id"] for r in rows) == sorted(key.items)
    assert [key.items[r["item_id"]].baseline for r in rows] != sorted(key.items[r["item_id"]].baseline for r in rows)
    for row in rows:
        item = key.items[row["item_id"]]
        assert TOKENS[item.system_a] in row["conversation_a"] and TOKENS[item.system_b] in row["conversation_b"]
        assert "The Anchor:" in row["conversation_a" if item.system_a == "mascot" else "conversation_b"]
        assert row["context"].startswith("User:") and not (row["rater"] or row["choice"] or row["comment"])
    for path in (result.sheet_csv, result.sheet_html):
        text = path.read_text().lower()
        for name, spec in SYSTEMS.items():
            assert name not in text and spec.label.lower() not in text, f"{path.name} names {name}"
    assert export(run_dir).items == 16 and read_key(result.key) == key, "the same export again: the same key"


def test_sampling_per_baseline_and_choosing_baselines(tmp_path):
    run_dir = make_run(tmp_path, contexts=4, seeds=(0, 1))
    result = export(run_dir, per_baseline=3, baselines=["zero_shot"], seed=5)
    key = read_key(result.key)
    assert result.per_baseline == {"zero_shot": 3} and {i.baseline for i in key.items.values()} == {"zero_shot"}
    with pytest.raises(HumanRatingsError, match="already holds the key of another export"):
        export(run_dir, seed=6)
    assert read_key(result.key) == key, "the refused export changed nothing"
    assert export(run_dir, seed=6, force=True).items == 16
    with pytest.raises(HumanRatingsError, match="--baselines: few_shot played no conversation.*multi_agent"):
        export(run_dir, baselines=["few_shot"], force=True)
    with pytest.raises(HumanRatingsError, match="the key is inside"):
        export_sheets(run_dir, tmp_path / "out", tmp_path / "out" / "key.json")


def test_the_page_is_self_contained_lists_every_item_and_escapes_conversation_text(tmp_path):
    result = export(make_run(tmp_path))
    page = result.sheet_html.read_text()
    assert not re.search(r"https?://", page) and not re.search(r"""(src|href)\s*=\s*["']?(//|\w+:)""", page)
    assert "<link" not in page and page.count("<script") == 1, "one inline script, ours"
    for item_id in read_key(result.key).items:
        assert f'data-id="{item_id}"' in page and f'name="choice-{item_id}"' in page
    assert INJECTION not in page and "&lt;script&gt;alert(&quot;owned&quot;)&lt;/script&gt;" in page
    assert 'value="A"' in page and 'value="B"' in page and 'value="tie"' in page and 'id="rater"' in page
    # The page's download writes exactly the columns import reads.
    assert '["item_id", "rater", "choice", "comment"]' in page


def choice(key, item_id: str, outcome: float) -> str:
    """The choice that gives MASCOT this outcome on this item: win 1, tie 0.5, loss 0."""
    side = key.items[item_id].mascot_side
    return "tie" if outcome == 0.5 else side if outcome == 1 else {"A": "B", "B": "A"}[side]


def test_win_rate_and_agreement_by_hand(tmp_path):
    run_dir = make_run(tmp_path, contexts=3)
    key = read_key(export(run_dir).key)
    item = {(i.baseline, i.context_id): item_id for item_id, i in key.items.items()}
    c1, c2, c3 = sorted({i.context_id for i in key.items.values()})
    # MASCOT's outcomes. Against zero_shot: r1 wins, wins, ties; r2 wins, loses, wins.
    # Against multi_agent: r1 loses, loses, ties; r2 rated c1 only, a loss.
    first = [(item["zero_shot", c], "r1", o) for c, o in ((c1, 1), (c2, 1), (c3, 0.5))]
    first += [(item["multi_agent", c], "r1", o) for c, o in ((c1, 0), (c2, 0), (c3, 0.5))]
    first += [(item["multi_agent", c1], "r2", 0)]  # one file may hold several raters
    second = [(item["zero_shot", c], "r2", o) for c, o in ((c1, 1), (c2, 0), (c3, 1))]
    files = [write_ratings(tmp_path / name, [(i, r, choice(key, i, o), "") for i, r, o in rows])
             for name, rows in (("first.csv", first), ("second.csv", second))]
    summary = import_ratings(run_dir, files, run_dir / "eval" / "human_key.json",
                             run_dir / "eval" / "human_results.json")
    assert json.loads((run_dir / "eval" / "human_results.json").read_text())["results"] == summary["results"]
    multi, zero = summary["results"]
    assert (zero["baseline"], zero["raters"], zero["ratings"], zero["contexts"]) == ("zero_shot", 2, 6, 3)
    assert (zero["wins"], zero["ties"], zero["losses"]) == (4, 1, 1)
    assert zero["win_rate"] == pytest.approx(4.5 / 6) and zero["ci_low"] <= 0.75 <= zero["ci_high"] <= 1
    # Ordinal alpha by hand. Units (r1, r2): c1 (1, 1), c2 (1, 0), c3 (0.5, 1); n = 6 pairable values,
    # n_0 = 1, n_0.5 = 1, n_1 = 4. Ordinal distance d(c, k) = (n_c + ... + n_k - (n_c + n_k) / 2)^2:
    # d(0, 0.5) = (2 - 1)^2 = 1, d(0.5, 1) = (5 - 2.5)^2 = 6.25, d(0, 1) = (6 - 2.5)^2 = 12.25.
    # Observed: each unit of two values adds both ordered pairs: D_o = (2 * 12.25 + 2 * 6.25) / 6 = 37 / 6.
    # Expected: D_e = 2 * (1 * 1 * 1 + 1 * 4 * 6.25 + 1 * 4 * 12.25) / (6 * 5) = 5. alpha = 1 - D_o / D_e.
    assert zero["agreement"]["alpha"] == pytest.approx(1 - (37 / 6) / 5) == pytest.approx(-7 / 30)
    assert (zero["agreement"]["items"], zero["agreement"]["level"]) == (3, "ordinal")
    assert (multi["raters"], multi["ratings"], multi["wins"], multi["ties"], multi["losses"]) == (2, 4, 0, 1, 3)
    assert multi["win_rate"] == pytest.approx(0.5 / 4) and multi["items"] == 3 and multi["items_in_sheet"] == 3
    assert multi["agreement"]["alpha"] is None
    assert "1 item(s) rated by two or more raters" in multi["agreement"]["reason"]
    assert summary["raters"] == ["r1", "r2"] and [f["ratings"] for f in summary["ratings_files"]] == [7, 3]


def test_a_filled_in_sheet_is_read_and_its_blank_rows_counted(tmp_path):
    run_dir = make_run(tmp_path, contexts=3)
    sheet = run_dir / "eval" / "human" / "sheet.csv"
    export(run_dir)
    rows = sheet_rows(sheet)
    rows[0] |= {"rater": "ann", "choice": "a"}  # a spreadsheet's lower case is still A
    rows[1] |= {"rater": "ann", "choice": "Tie", "comment": "both kind,\nneither better"}
    filled = tmp_path / "filled.csv"
    write_ratings(filled, [tuple(r.values()) for r in rows], header=tuple(rows[0]))
    summary = import_ratings(run_dir, [filled], run_dir / "eval" / "human_key.json", tmp_path / "results.json")
    assert summary["ratings_files"][0]["ratings"] == 2 and summary["ratings_files"][0]["blank_rows"] == 4
    assert sum(r["ratings"] for r in summary["results"]) == 2
    # A problem on the third record is reported at the line it starts on, after two multi-line records.
    rows[2] |= {"rater": "ann", "choice": "maybe"}
    write_ratings(filled, [tuple(r.values()) for r in rows], header=tuple(rows[0]))
    start = next(n for n, line in enumerate(filled.read_text().splitlines(), 1) if line.startswith(rows[2]["item_id"]))
    with pytest.raises(HumanRatingsError) as error:
        import_ratings(run_dir, [filled], run_dir / "eval" / "human_key.json", tmp_path / "results.json")
    assert error.value.problems == [f"{filled}:{start}: choice: 'maybe'; expected A, B or tie"] and start > 4


@pytest.mark.parametrize(("rows", "header", "expected"), [
    ([("nosuchitem", "r1", "A", "")], None, ":2: item_id: 'nosuchitem' is not an item of this key's sheets"),
    ([("{0}", "r1", "A", ""), ("{1}", "r1", "B", ""), ("{0}", "r1", "tie", "")], None,
     ":4: item_id: rater 'r1' rated item {0} again (first at {file}:2); keep one"),
    ([("{0}", " ", "A", "")], None, ":2: rater: empty; every rating needs its rater's id"),
    ([("{0}", "ann\nbo", "A", "")], None, ":2: rater: 'ann\\nbo': use 1 to 40 letters, digits, '.', '_' or '-'"),
    ([("{0}", "../ann", "A", "")], None, ":2: rater: '../ann': use 1 to 40 letters"),
    ([("{0}", "r1", "C", "")], None, ":2: choice: 'C'; expected A, B or tie"),
    ([("{0}", "A")], ("item_id", "choice"), ":1: missing column(s) rater; expected a header with item_id, rater"),
])
def test_a_bad_ratings_file_is_refused_with_its_line_and_field_and_nothing_is_written(tmp_path, rows, header,
                                                                                      expected):
    run_dir = make_run(tmp_path)
    ids = list(read_key(export(run_dir).key).items)
    path = tmp_path / "ratings.csv"
    write_ratings(path, [tuple(cell.format(*ids) for cell in row) for row in rows],
                  **({"header": header} if header else {}))
    out = run_dir / "eval" / "human_results.json"
    with pytest.raises(HumanRatingsError) as error:
        import_ratings(run_dir, [path], run_dir / "eval" / "human_key.json", out)
    [problem] = error.value.problems
    assert problem.startswith(f"{path}{expected.format(*ids, file=path)}"), problem
    assert not out.exists()


def test_a_duplicate_across_files_a_file_not_in_utf8_and_a_missing_key(tmp_path):
    run_dir = make_run(tmp_path)
    key_path = run_dir / "eval" / "human_key.json"
    item_id = next(iter(read_key(export(run_dir).key).items))
    first = write_ratings(tmp_path / "one.csv", [(item_id, "r1", "A", "")])
    second = write_ratings(tmp_path / "two.csv", [(item_id, "r2", "A", ""), (item_id, "r1", "B", "")])
    with pytest.raises(HumanRatingsError, match=re.escape(f"{second}:3: item_id: rater 'r1' rated item {item_id} again "
                                                          f"(first at {first}:2)")):
        import_ratings(run_dir, [first, second], key_path, tmp_path / "results.json")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(f"item_id,rater,choice,comment\n{item_id},r3,A,très bien\n".encode("cp1252"))
    with pytest.raises(HumanRatingsError, match=re.escape(f"{latin}: not a UTF-8 CSV file")):
        import_ratings(run_dir, [latin], key_path, tmp_path / "results.json")
    with pytest.raises(FileNotFoundError, match=re.escape("run `mascot eval export-human RUN` first")):
        import_ratings(run_dir, [first], tmp_path / "nokey.json", tmp_path / "results.json")
    assert not (tmp_path / "results.json").exists()


def test_a_file_given_twice_or_copied_is_refused_by_its_content_and_a_row_already_read_too(tmp_path):
    run_dir = make_run(tmp_path)
    key_path, out = run_dir / "eval" / "human_key.json", tmp_path / "results.json"
    first, second = list(read_key(export(run_dir).key).items)[:2]
    ratings = write_ratings(tmp_path / "ann.csv", [(first, "ann", "A", "")])
    copy = tmp_path / "copy.csv"
    copy.write_bytes(ratings.read_bytes())
    for paths, expected in (([ratings, ratings], f"{ratings}: given twice (sha256 "),
                            ([ratings, copy], f"{copy}: the same content as {ratings} (sha256 ")):
        with pytest.raises(HumanRatingsError) as error:
            import_ratings(run_dir, paths, key_path, out)
        [problem] = error.value.problems
        assert problem.startswith(expected) and "each ratings file counts once" in problem, problem
    # the same file with one row more: its first row was read already
    grown = write_ratings(tmp_path / "ann-more.csv", [(first, "ann", "A", ""), (second, "ann", "B", "")])
    with pytest.raises(HumanRatingsError, match=re.escape(f"{grown}:2: item_id: rater 'ann' rated item {first} again "
                                                          f"(first at {ratings}:2)")):
        import_ratings(run_dir, [ratings, grown], key_path, out)
    assert not out.exists()
    assert import_ratings(run_dir, [ratings], key_path, out)["results"][0]["ratings"] == 1


def test_a_key_of_another_run_is_refused_with_both_hashes(tmp_path):
    run_dir, other = make_run(tmp_path / "one"), make_run(tmp_path / "two", contexts=2)
    item_id = next(iter(read_key(export(run_dir).key).items))
    other_key = read_key(export(other).key)
    ratings = write_ratings(tmp_path / "ann.csv", [(item_id, "ann", "A", "")])
    mine = read_key(run_dir / "eval" / "human_key.json").conversations_sha256
    with pytest.raises(HumanRatingsError) as error:
        import_ratings(run_dir, [ratings], other / "eval" / "human_key.json", tmp_path / "results.json")
    [problem] = error.value.problems
    assert problem.startswith(f"{other / 'eval' / 'human_key.json'}: conversations_sha256: the key belongs to")
    assert other_key.conversations_sha256 in problem and mine in problem and mine != other_key.conversations_sha256
    result = runner.invoke(app, ["eval", "import-human", str(run_dir), str(ratings), "--key",
                                 str(other / "eval" / "human_key.json")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "use the key exported from this run" in " ".join(result.output.split())
    assert not (tmp_path / "results.json").exists()


def test_the_commands(tmp_path):
    run_dir = make_run(tmp_path)
    for command in (["eval"], ["eval", "export-human"], ["eval", "import-human"]):
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, result.output
    result = runner.invoke(app, ["eval", "export-human", str(run_dir), "--per-baseline", "2"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "4 blind comparisons (multi_agent 2, zero_shot 2)" in output
    assert f"send to raters: {run_dir}/eval/human/sheet.html" in output
    assert f"keep back: {run_dir}/eval/human_key.json" in output
    item_id = next(iter(read_key(run_dir / "eval" / "human_key.json").items))
    good = write_ratings(tmp_path / "good.csv", [(item_id, "r1", "tie", "")])
    result = runner.invoke(app, ["eval", "import-human", str(run_dir), str(good)])
    assert result.exit_code == 0 and "Human preference, 1 rater(s)" in result.output, result.output
    assert (run_dir / "eval" / "human_results.json").exists()
    bad = write_ratings(tmp_path / "bad.csv", [(item_id, "r1", "maybe", "")])
    result = runner.invoke(app, ["eval", "import-human", str(run_dir), str(bad)])
    assert result.exit_code == 2, result.output
    assert f"{bad}:2: choice: 'maybe'; expected A, B or tie" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["eval", "export-human", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "run `mascot run evaluate` for this run first" in " ".join(result.output.split())


def rate_by_the_sheet(sheet: Path, rater: str, out: Path, pick) -> Path:
    """A rater's file written from what the sheet shows, never from the key: `pick(row)` reads the row's texts."""
    return write_ratings(out, [(row["item_id"], rater, pick(row), "") for row in sheet_rows(sheet)])


def mascot_shown_on(row: dict[str, str]) -> str:
    """The side whose conversation holds MASCOT's word: what a rater who always prefers MASCOT would pick."""
    a, b = (TOKENS["mascot"] in row[f"conversation_{side}"] for side in "ab")
    assert a != b, "MASCOT's conversation is on exactly one side"
    return "A" if a else "B"


def preferences(run_dir: Path, winner_of) -> None:
    """eval/preferences.parquet as `pairwise.judge_preferences` writes it: both orders of every comparison, the
    verdict read from MASCOT's side by `winner_of(baseline)` (1 a win, 0 a loss)."""
    contexts = read_key(run_dir / "eval" / "human_key.json").items.values()
    rows = []
    for baseline, context_id, seed in sorted({item.comparison for item in contexts}):
        for order, mine in (("mascot_first", "A"), ("mascot_second", "B")):
            mascot = winner_of(baseline)
            winner = mine if mascot == 1 else {"A": "B", "B": "A"}[mine]
            rows.append({"baseline": baseline, "context_id": context_id, "seed": seed, "order": order,
                         "judge": "heuristic", "winner": winner, "mascot": float(mascot), "reason": "",
                         "ok": True, "error": None, "attempts": 1})
    RunDir(run_dir).record({"eval/preferences": write_parquet(pl.DataFrame(rows, schema=PREFERENCE_SCHEMA),
                                                              run_dir / "eval" / "preferences.parquet")})


def test_a_rater_who_prefers_mascot_by_what_the_sheet_shows_wins_every_item_on_every_rater_s_sheet(tmp_path):
    """The winning side comes from the sheet's text (MASCOT's word), not from the key: were the key's side read
    the wrong way round, MASCOT would lose every item."""
    run_dir = make_run(tmp_path, contexts=4, seeds=(0, 1))
    result = export(run_dir, raters=["ann", "bo"])
    preferences(run_dir, lambda baseline: 1 if baseline == "zero_shot" else 0)
    files = [rate_by_the_sheet(result.rater_sheets[r] / "sheet.csv", r, tmp_path / f"{r}.csv", mascot_shown_on)
             for r in ("ann", "bo")]
    summary = import_ratings(run_dir, files, run_dir / "eval" / "human_key.json", tmp_path / "results.json")
    assert summary["sheets"] == "one per rater"
    for entry in summary["results"]:
        assert (entry["wins"], entry["ties"], entry["losses"], entry["raters"], entry["items"]) == (16, 0, 0, 2, 8)
        assert entry["win_rate"] == 1 and entry["agreement"]["reason"] == "every rating of the shared items is " \
                                                                          "the same, so alpha is undefined (0/0)"
        # Each rater's own sheet puts MASCOT on A half the time, so picking MASCOT picks A half the time.
        assert entry["side_a_share"]["share"] == 0.5 and entry["side_a_share"]["n"] == 16
        # The judge gave MASCOT every zero_shot comparison and no multi_agent one.
        expected = 1.0 if entry["baseline"] == "zero_shot" else 0.0
        assert entry["judge_agreement"]["share"] == expected and entry["judge_agreement"]["n"] == 16


def test_a_rater_who_always_picks_a_shows_position_bias_and_no_preference(tmp_path):
    run_dir = make_run(tmp_path, contexts=4, seeds=(0, 1))
    result = export(run_dir, raters=["ann", "bo"])
    files = [rate_by_the_sheet(result.rater_sheets[r] / "sheet.csv", r, tmp_path / f"{r}.csv", lambda row: "A")
             for r in ("ann", "bo")]
    summary = import_ratings(run_dir, files, run_dir / "eval" / "human_key.json", tmp_path / "results.json")
    for entry in summary["results"]:
        assert entry["side_a_share"]["share"] == 1 and entry["win_rate"] == 0.5, "balanced sides, per rater"
        assert entry["judge_agreement"] is None, "the run judged no pairwise preferences"
        assert entry["interval"] == "percentile bootstrap over contexts and raters, crossed"


def test_each_rater_gets_the_same_comparisons_with_their_own_sides_and_order(tmp_path):
    run_dir = make_run(tmp_path, contexts=4, seeds=(0, 1))
    result = export(run_dir, raters=["ann", "bo", "cy"])
    key = read_key(result.key)
    assert result.items == 16 and result.per_baseline == {"multi_agent": 8, "zero_shot": 8}
    assert key.raters == ["ann", "bo", "cy"] and len(key.items) == 48
    shown = {}
    for rater in key.raters:
        rows = sheet_rows(result.rater_sheets[rater] / "sheet.csv")
        assert {row["rater"] for row in rows} == {rater}, "the rater's id is filled in"
        assert f'id="rater" autocomplete="off" value="{rater}"' in (result.rater_sheets[rater] / "sheet.html").read_text()
        items = [key.items[row["item_id"]] for row in rows]
        assert {item.rater for item in items} == {rater}
        for baseline in ("zero_shot", "multi_agent"):
            sides = [item.mascot_side for item in items if item.baseline == baseline]
            assert sorted(sides) == ["A"] * 4 + ["B"] * 4, f"balanced within each baseline for {rater}"
        # what the sheet shows, read from its text: the order of comparisons and the side MASCOT is on
        shown[rater] = [(item.comparison, mascot_shown_on(row)) for item, row in zip(items, rows, strict=True)]
    comparisons = {rater: [c for c, _ in pairs] for rater, pairs in shown.items()}
    assert len({frozenset(c) for c in comparisons.values()}) == 1, "every rater rates the same comparisons"
    assert len({tuple(c) for c in comparisons.values()}) == 3, "in an order of their own"
    sides = {rater: dict(pairs) for rater, pairs in shown.items()}
    assert sides["ann"] != sides["bo"] != sides["cy"] != sides["ann"], "with sides of their own"
    assert read_key(export(run_dir, raters=["ann", "bo", "cy"]).key) == key, "the same export: the same key"
    # A rater who rates another rater's sheet is refused: its sides and order are not theirs.
    ann_item = next(row["item_id"] for row in sheet_rows(result.rater_sheets["ann"] / "sheet.csv"))
    wrong = write_ratings(tmp_path / "bo.csv", [(ann_item, "bo", "A", "")])
    with pytest.raises(HumanRatingsError) as error:
        import_ratings(run_dir, [wrong], result.key, tmp_path / "results.json")
    assert error.value.problems == [(f"{wrong}:2: item_id: {ann_item} is on rater 'ann''s own sheet, rated here by "
                                     "'bo'; each rater rates their own sheet, whose sides and order are theirs")]


@pytest.mark.parametrize(("raters", "expected"), [
    (["ann", "ann"], "--raters: 'ann' is named twice"),
    (["ann", "../bo"], "--raters: '../bo': use 1 to 40 letters"),
    ([], "--raters: no rater named"),
])
def test_bad_rater_ids_are_refused_at_export(tmp_path, raters, expected):
    run_dir = make_run(tmp_path)
    with pytest.raises(HumanRatingsError) as error:
        export(run_dir, raters=raters)
    assert error.value.problems[0].startswith(expected)
    assert not (run_dir / "eval" / "human_key.json").exists()


def test_the_rating_page_serves_one_rater_s_own_sheet(tmp_path):
    run_dir = make_run(tmp_path)
    result = export(run_dir, raters=["ann", "bo"])
    ann = sheet_items(run_dir, result.key, "ann")
    assert [item.item_id for item in ann] == [row["item_id"] for row in sheet_rows(result.rater_sheets["ann"] /
                                                                                   "sheet.csv")]
    with pytest.raises(HumanRatingsError, match=r"one sheet per rater \(ann, bo\); pass --rater"):
        sheet_items(run_dir, result.key)
    with pytest.raises(HumanRatingsError, match="'cy' is not one of them"):
        sheet_items(run_dir, result.key, "cy")
    export(run_dir, force=True)
    with pytest.raises(HumanRatingsError, match="one sheet shared by every rater; leave --rater out"):
        sheet_items(run_dir, result.key, "ann")


def test_the_commands_with_a_sheet_per_rater(tmp_path):
    run_dir = make_run(tmp_path)
    result = runner.invoke(app, ["eval", "export-human", str(run_dir), "--raters", "ann,bo"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert f"send to ann: {run_dir}/eval/human/ann/sheet.html (their own sides and order)" in output
    assert f"send to bo: {run_dir}/eval/human/bo/sheet.html" in output
    files = [rate_by_the_sheet(run_dir / "eval" / "human" / r / "sheet.csv", r, tmp_path / f"{r}.csv",
                               mascot_shown_on) for r in ("ann", "bo")]
    result = runner.invoke(app, ["eval", "import-human", str(run_dir), *map(str, files)])
    assert result.exit_code == 0, result.output
    assert "interval over contexts and raters, crossed" in " ".join(result.output.split())
    assert "50% [" in result.output, "side A's share, with its interval"
    result = runner.invoke(app, ["eval", "export-human", str(run_dir), "--raters", "ann,ann", "--force"])
    assert result.exit_code == 2 and "--raters: 'ann' is named twice" in result.output, result.output
