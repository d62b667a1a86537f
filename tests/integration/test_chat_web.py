"""`mascot chat RUN --web`: the page's API served by uvicorn on loopback, and the page itself in headless Chromium
(Debian's chromium and chromedriver, driven by Selenium)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import httpx
import pytest
from browser import chromium, wait_for
from chat_server import DEFAULT_MODEL, make_app
from loopback_servers import serve
from served_models import ServedModels

from cli.web.chat_app import chat_app
from mascot.chat.group import load_group
from mascot.chat.transcript import load_transcript
from mascot.config import ChatConfig

pytestmark = pytest.mark.integration


def exchange(url: str, session: str, text: str, turns: int | None = None) -> list[dict]:
    events = []
    with httpx.stream("POST", f"{url}/api/sessions/{session}/messages", json={"text": text, "turns": turns},
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    return events


def open_session(url: str) -> str:
    response = httpx.post(f"{url}/api/sessions", json={})
    assert response.status_code == 200, response.text
    return response.json()["id"]


@pytest.fixture(scope="module")
def simulated():
    """A loopback server slow enough (20 ms a word) that a reply visibly streams and an exchange takes a while."""
    app = make_app(seconds_per_token=0.02, served=vllm_like())
    with serve(app) as url:
        yield app, url


def vllm_like() -> ServedModels:
    """The loopback server as the paper profile's vLLM: it loads the run's adapters at runtime."""
    return ServedModels(DEFAULT_MODEL, allow_runtime_lora=True)


def simulated_chat(url: str):
    """The run's chat section with both roles on the loopback server, as the paper profile serves them: the run's
    adapters loaded into it under names carrying their hashes."""
    roles = {role: {"kind": "openai", "model": DEFAULT_MODEL, "load_adapter": True, "base_url": f"{url}/v1",
                    "params": {"max_new_tokens": 40}} for role in ("speaker", "director")}
    return ChatConfig.model_validate({**roles, "max_sessions": 3})


def test_the_page_streams_an_exchange_with_the_trained_group_and_gives_its_transcript(chat_run):
    group = load_group(chat_run, progress=False)
    with serve(chat_app(group, seed=2)) as url:
        page = httpx.get(url)
        assert page.status_code == 200 and "/static/chat.js" in page.text
        info = httpx.get(f"{url}/api/group").json()
        assert [p["name"] for p in info["personas"]] == ["The Anchor", "The Catalyst", "The Beacon"]
        assert "not a clinician" in info["notice"] and info["replay"] is False
        session = open_session(url)
        events = exchange(url, session, "I lost my job today.")
        assert events[0] == {**events[0], "type": "user", "text": "I lost my job today."} and events[-1]["type"] == "done"
        replies = [e for e in events if e["type"] == "reply"]
        assert len(replies) == 2
        for reply in replies:
            deltas = "".join(e["text"] for e in events if e["type"] == "delta" and e["position"] == reply["position"])
            assert deltas == reply["text"] and reply["speaker"] == reply["directive"]["speaker"]
        saved = httpx.get(f"{url}/api/sessions/{session}/transcript")
        assert saved.headers["content-disposition"] == 'attachment; filename="transcript.json"'
        assert [e["type"] for e in saved.json()["entries"]] == ["user", "reply", "reply"]
        markdown = httpx.get(f"{url}/api/sessions/{session}/transcript", params={"format": "md"}).text
        assert f"**{replies[0]['name']}:** {replies[0]['text']}" in markdown


def test_every_request_is_bounded(chat_run, simulated):
    _, loopback = simulated
    group = load_group(chat_run, chat=simulated_chat(loopback), progress=False)
    with serve(chat_app(group, max_sessions=2, session_idle_s=3600)) as url:
        session = open_session(url)
        huge = httpx.post(f"{url}/api/sessions/{session}/messages", content=b'{"text": "' + b"a" * 30000 + b'"}',
                          headers={"content-type": "application/json"})
        assert huge.status_code == 413 and "at most 2000 characters" in huge.json()["detail"]
        long = httpx.post(f"{url}/api/sessions/{session}/messages", json={"text": "a" * 2001})
        assert long.status_code == 422 and "2001 characters; at most 2000" in long.json()["detail"]
        # 1,990 characters, escaped as json.dumps and requests send them by default: \u00e9 is 6 bytes, an emoji 12
        escaped = json.dumps({"text": "é" * 1000 + "\U0001F600" * 990, "turns": 1}).encode()
        assert escaped.isascii() and len(escaped) > 4 * 2000 + 1024, "the old limit's 4 bytes a character"
        accepted = httpx.post(f"{url}/api/sessions/{session}/messages", content=escaped, timeout=120,
                              headers={"content-type": "application/json"})
        assert accepted.status_code == 200 and '"type": "reply"' in accepted.text, accepted.text[:300]
        malformed = httpx.post(f"{url}/api/sessions/{session}/messages", json={"text": "hi", "turns": 99})
        assert malformed.status_code == 422 and "turns" in malformed.json()["detail"]
        assert httpx.post(f"{url}/api/sessions/nope/messages", json={"text": "hi"}).status_code == 404
        open_session(url)
        full = httpx.post(f"{url}/api/sessions", json={})
        assert full.status_code == 429 and "2 conversations are open already" in full.json()["detail"]
        # one message at a time per conversation
        answering = threading.Thread(target=exchange, args=(url, session, "first", 3))
        answering.start()
        time.sleep(0.3)
        busy = httpx.post(f"{url}/api/sessions/{session}/messages", json={"text": "second"})
        answering.join()
        assert busy.status_code == 409 and "still answering" in busy.json()["detail"]
        # closing a conversation frees its place
        assert httpx.post(f"{url}/api/sessions/{session}/close", json={}).status_code == 200
        open_session(url)


def test_tabs_are_separate_conversations_and_a_slow_one_holds_up_no_other(chat_run, simulated):
    app, loopback = simulated
    group = load_group(chat_run, chat=simulated_chat(loopback), progress=False)
    with serve(chat_app(group)) as url:
        slow, quick = open_session(url), open_session(url)
        finished: dict[str, float] = {}

        def talk(session: str, text: str, turns: int) -> None:
            exchange(url, session, text, turns)
            finished[session] = time.monotonic()

        long_exchange = threading.Thread(target=talk, args=(slow, "a long answer please", 8))
        long_exchange.start()
        time.sleep(0.5)  # the slow tab's group is answering
        assert app.state.stats.in_flight == 1
        talk(quick, "a short one", 1)
        assert long_exchange.is_alive(), "the second tab waited for the first to finish"
        long_exchange.join()
        assert finished[quick] < finished[slow]
        transcripts = {s: httpx.get(f"{url}/api/sessions/{s}/transcript").json() for s in (slow, quick)}
        assert [e["text"] for e in transcripts[quick]["entries"] if e["type"] == "user"] == ["a short one"]
        assert len([e for e in transcripts[slow]["entries"] if e["type"] == "reply"]) == 8


def test_a_replay_serves_the_saved_conversation_read_only(chat_run, tmp_path):
    from mascot.chat.session import ChatSession

    group = load_group(chat_run, progress=False)
    session = ChatSession(group, seed=0)
    path, _ = session.transcript.save(tmp_path / "empty.json")
    with serve(chat_app(replay=load_transcript(path))) as url:
        assert httpx.get(f"{url}/api/group").json()["replay"] is True
        assert httpx.get(f"{url}/api/replay").json()["seed"] == 0
        assert httpx.post(f"{url}/api/sessions", json={}).status_code == 409


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


def test_the_page_in_a_browser(chat_run, simulated, browser, tmp_path):
    from selenium.webdriver.common.by import By

    _, loopback = simulated
    group = load_group(chat_run, chat=simulated_chat(loopback), progress=False)
    with serve(chat_app(group, seed=1)) as url:
        browser.get(url)
        roster = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#roster li"), what="the roster")
        assert [item.text.split(",")[0] for item in roster] == ["The Anchor", "The Catalyst", "The Beacon"]
        assert "not a clinician" in browser.find_element(By.ID, "notice").text
        browser.find_element(By.ID, "input").send_keys("I have been feeling lonely since I moved.")
        browser.find_element(By.ID, "send").click()

        # a reply is seen growing while it streams, and ends as the text the server finished with
        partial = wait_for(lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".msg.reply.streaming .text")
                                    if len(e.text.split()) >= 2], what="a streaming reply")[0]
        wait_for(lambda: not browser.find_element(By.ID, "send").get_attribute("disabled"), what="the answer")
        replies = browser.find_elements(By.CSS_SELECTOR, ".msg.reply")
        assert len(replies) == 2 and not browser.find_elements(By.CSS_SELECTOR, ".msg.streaming")
        final_texts = [r.find_element(By.CLASS_NAME, "text").text for r in replies]
        assert any(text.startswith(partial) and len(text) > len(partial) for text in final_texts)
        assert browser.find_element(By.CSS_SELECTOR, ".msg.user").text == "I have been feeling lonely since I moved."

        replies[1].click()  # /why
        why = browser.find_element(By.ID, "why").text
        assert "instruction" in why and "fallback" in why and "attempts" in why
        browser.save_screenshot(str(tmp_path / "chat.png"))
        if os.environ.get("MASCOT_CHAT_SCREENSHOT"):  # for looking at the page by eye
            shutil.copy(tmp_path / "chat.png", os.environ["MASCOT_CHAT_SCREENSHOT"])

        browser.find_element(By.ID, "download-json").click()
        saved = wait_for(lambda: [p for p in browser.downloads.glob("transcript*.json")], what="the download")[0]
        transcript = load_transcript(saved)
        entries = [e for e in transcript.entries if e.type == "reply"]
        assert [e.text for e in entries] == final_texts
        assert entries[1].directive.instruction in why
