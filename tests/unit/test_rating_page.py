"""`mascot eval rate RUN --web`: the blind items served one at a time, each choice saved as the file import-human
reads; and the page in headless Chromium, rated with the keyboard."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from browser import chromium, wait_for
from loopback_servers import serve
from test_human_ratings import TOKENS, choice, export, make_run, sheet_rows
from typer.testing import CliRunner

from cli.main import app
from cli.web.rating_app import rating_app
from mascot.evaluation.human import import_ratings, read_key, sheet_items
from mascot.evaluation.systems import SYSTEMS

runner = CliRunner()


@pytest.fixture
def page(tmp_path):
    run_dir = make_run(tmp_path, contexts=3)
    key_path = export(run_dir).key
    key = read_key(key_path)
    with serve(rating_app(sheet_items(run_dir, key_path), key, run_dir / "eval" / "human_ratings")) as url:
        yield url, run_dir, key


def test_the_items_are_the_sheets_and_name_no_system(page):
    url, run_dir, key = page
    listed = httpx.get(f"{url}/api/items").json()["items"]
    sheet = [row["item_id"] for row in sheet_rows(run_dir / "eval" / "human" / "sheet.csv")]
    assert [item["item_id"] for item in listed] == sheet != sorted(sheet), "the sheet's shuffled order"
    served = httpx.get(f"{url}/api/items").text.lower()
    for name, spec in SYSTEMS.items():
        assert f'"{name}"' not in served and spec.label.lower() not in served
    for item in listed:  # each side is the conversation the key says, by the word only its system's turns hold
        truth = key.items[item["item_id"]]
        assert TOKENS[truth.system_a] in str(item["a"]) and TOKENS[truth.system_b] in str(item["b"])
    assert "key" not in httpx.get(f"{url}/api/items").json()


def test_each_choice_is_saved_as_import_reads_it_and_a_rater_finds_theirs_again(page):
    url, run_dir, key = page
    items = list(key.items)
    outcomes = [1, 0.5, 0, 1, 1, 0]  # MASCOT's, item by item
    for item_id, outcome in zip(items, outcomes, strict=True):
        response = httpx.post(f"{url}/api/ratings", json={"rater": "ann", "item_id": item_id,
                                                          "choice": choice(key, item_id, outcome), "comment": " ok "})
        assert response.status_code == 200, response.text
    changed = httpx.post(f"{url}/api/ratings", json={"rater": "ann", "item_id": items[1],
                                                     "choice": choice(key, items[1], 1)}).json()
    assert changed["rated"] == 6 and changed["items"] == 6  # a second choice replaces the first
    saved = httpx.get(f"{url}/api/ratings/ann").json()
    assert saved[items[0]] == {"choice": choice(key, items[0], 1), "comment": "ok"}
    assert httpx.get(f"{url}/api/ratings/bo").json() == {}
    path = run_dir / "eval" / "human_ratings" / "ratings-ann.csv"
    summary = import_ratings(run_dir, [path], run_dir / "eval" / "human_key.json", run_dir / "eval" / "out.json")
    by_item = dict(zip(items, [1, 1, 0, 1, 1, 0], strict=True))
    for entry in summary["results"]:
        expected = [by_item[i] for i, item in key.items.items() if item.baseline == entry["baseline"]]
        assert entry["ratings"] == 3 and entry["win_rate"] == pytest.approx(sum(expected) / 3)


@pytest.mark.parametrize("body, problem", [
    ({"rater": "../x", "item_id": "{item}", "choice": "A"}, "rater id '../x'"),
    ({"rater": "ann", "item_id": "nope", "choice": "A"}, "item 'nope' is not an item"),
    ({"rater": "ann", "item_id": "{item}", "choice": "C"}, "choice 'C': expected one of A, B, tie"),
])
def test_a_bad_rating_is_refused_and_nothing_is_written(page, body, problem):
    url, run_dir, key = page
    body = {k: v.format(item=next(iter(key.items))) for k, v in body.items()}
    response = httpx.post(f"{url}/api/ratings", json=body)
    assert response.status_code == 422 and problem in response.json()["detail"]
    assert not (run_dir / "eval" / "human_ratings").exists()


def test_the_command_needs_web_and_an_export(tmp_path):
    run_dir = make_run(tmp_path)
    result = runner.invoke(app, ["eval", "rate", str(run_dir)])
    assert result.exit_code == 2 and "add --web" in result.output
    result = runner.invoke(app, ["eval", "rate", str(run_dir), "--web"])
    assert result.exit_code == 2 and "run `mascot eval export-human RUN` first" in " ".join(result.output.split())


@pytest.mark.integration
def test_rating_with_the_keyboard_in_a_browser(page, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, run_dir, key = page
    with chromium(tmp_path) as browser:
        browser.get(url)
        wait_for(lambda: browser.find_element(By.ID, "number").text == "Item 1 of 6", what="the first item")
        browser.find_element(By.ID, "rater").send_keys("cy", Keys.TAB)
        body = browser.find_element(By.TAG_NAME, "body")
        for keystroke in ("a", "t", "b"):
            shown = browser.find_element(By.ID, "item").get_attribute("data-id")
            body.send_keys(keystroke)
            wait_for(lambda shown=shown: browser.find_element(By.ID, "item").get_attribute("data-id") != shown,
                     what="the next item")
        assert browser.find_element(By.ID, "progress").text == "3 of 6 rated"
        body.send_keys(Keys.ARROW_LEFT)
        assert browser.find_element(By.ID, "number").text == "Item 3 of 6"
        assert browser.find_element(By.CSS_SELECTOR, "button.chosen").get_attribute("data-choice") == "B"
        if os.environ.get("MASCOT_RATE_SCREENSHOT"):
            browser.save_screenshot(os.environ["MASCOT_RATE_SCREENSHOT"])
    path = run_dir / "eval" / "human_ratings" / "ratings-cy.csv"
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = Path(path).read_text().splitlines()
    items = list(key.raters_items(None))  # the sheet's order
    assert rows[1:] == [f"{items[0]},cy,A,", f"{items[1]},cy,tie,", f"{items[2]},cy,B,"]


def test_a_rater_s_own_sheet_is_served_to_that_rater_only(tmp_path):
    run_dir = make_run(tmp_path)
    key_path = export(run_dir, raters=["ann", "bo"]).key
    key = read_key(key_path)
    items = sheet_items(run_dir, key_path, "ann")
    with serve(rating_app(items, key, run_dir / "eval" / "human_ratings", sheet_rater="ann")) as url:
        listed = httpx.get(f"{url}/api/items").json()
        assert listed["rater"] == "ann" and [i["item_id"] for i in listed["items"]] == list(key.raters_items("ann"))
        first = listed["items"][0]["item_id"]
        refused = httpx.post(f"{url}/api/ratings", json={"rater": "bo", "item_id": first, "choice": "A"})
        assert refused.status_code == 422 and "rater 'ann''s own sheet, not 'bo''s" in refused.text
        assert httpx.post(f"{url}/api/ratings", json={"rater": "ann", "item_id": first, "choice": "A"}).status_code \
            == 200
