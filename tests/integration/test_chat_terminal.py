"""`mascot chat` in a terminal, driven through a pseudo-terminal as a person would type, on a run directory with
the tiny profile's Speaker and Director in process; and what it refuses, with the reason."""

from __future__ import annotations

import json
import re
import subprocess

import pexpect
import pytest
from stage1_runs import MASCOT, REPO

from mascot.chat.transcript import load_transcript
from mascot.roster import load_roster

pytestmark = pytest.mark.integration
ROSTER = load_roster(REPO / "configs" / "rosters" / "emotional_support.yaml")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PROMPT = "you ›"
MESSAGES = ["I failed my driving test this morning.", "My sister says I should just try harder.",
            "Maybe I will book another lesson."]


@pytest.fixture(scope="module")
def run_dir(chat_run):
    return chat_run


def test_a_conversation_in_the_terminal_with_the_commands(run_dir, tmp_path):
    chat = pexpect.spawn(MASCOT, ["chat", str(run_dir), "--seed", "4"], encoding="utf-8", timeout=180,
                         dimensions=(60, 160))
    screen = []

    def answer(line: str, expect: str = PROMPT) -> str:
        chat.sendline(line)
        chat.expect_exact(expect)
        shown = chat.before
        chat.expect_exact(PROMPT) if expect != PROMPT else None
        screen.append(ANSI.sub("", shown + (chat.before if expect != PROMPT else "")))
        return screen[-1]

    chat.expect_exact(PROMPT)
    opening = ANSI.sub("", chat.before)
    assert "not a clinician" in opening and all(p.name in opening for p in ROSTER.active)
    answer(MESSAGES[0])
    who = answer("/who", expect="The Beacon")
    assert "The Anchor" in who and "emotional validator" in who
    answer(MESSAGES[1])
    why = answer("/why", expect="attempts")
    assert "Why the last reply" in why and "instruction" in why and "fallback" in why
    answer(MESSAGES[2])
    saved = answer(f"/save {tmp_path / 'talk'}", expect="saved")
    chat.sendline("/quit")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0, saved

    transcript = load_transcript(tmp_path / "talk.json")
    users = [e.text for e in transcript.entries if e.type == "user"]
    replies = [e for e in transcript.entries if e.type == "reply"]
    assert users == MESSAGES and len(replies) == 6  # two companion turns after each message
    for reply in replies:
        assert reply.speaker == reply.directive.speaker and reply.speaker in [p.id for p in ROSTER.active]
        assert reply.name == ROSTER.get(reply.speaker).name and reply.directive.attempts >= 1
    # what the screen showed is what the transcript holds: each reply under its persona's name
    shown = "".join(screen)
    for reply in replies:
        first_words = " ".join(reply.text.split()[:3])
        assert f"{reply.name}:" in shown and first_words in " ".join(shown.split())
    explained = replies[3].directive  # /why came after the second message's two replies
    assert transcript.name_of(explained.speaker) in screen[3] and explained.instruction.split()[0] in screen[3]
    markdown = (tmp_path / "talk.md").read_text()
    assert all(message in markdown for message in MESSAGES) and f"**{replies[0].name}:**" in markdown


def test_replay_renders_a_saved_conversation(run_dir, tmp_path):
    from mascot.chat.transcript import DirectiveView, ReplyEntry, Transcript, UserEntry, persona_views

    transcript = Transcript(run=str(run_dir), group=ROSTER.name, domain=ROSTER.domain,
                            personas=persona_views(ROSTER), seed=0, notice="a notice")
    transcript.entries += [UserEntry(text="hello there"),
                           ReplyEntry(speaker="beacon", name="The Beacon", text="You have come far.",
                                      directive=DirectiveView(speaker="beacon", instruction="Encourage.",
                                                              fallback=False, attempts=1))]
    path, _ = transcript.save(tmp_path / "saved.json")
    result = subprocess.run([MASCOT, "chat", "--replay", str(path)], check=False, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "hello there" in result.stdout and "The Beacon: You have come far." in result.stdout


@pytest.mark.parametrize("arguments, message", [
    ([], "give a run directory"),
    (["{tmp}"], "has no manifest.json"),
    (["{run}", "--personas", "anchor,nobody"], "nobody is not a persona of 'Emotional support companions'"),
    (["{run}", "--web", "--host", "0.0.0.0"], "--allow-remote"),
    (["--replay", "{tmp}/talk.md"], "no such transcript"),
    (["--replay", "{bad}"], "not a JSON transcript"),
    (["--replay", "{wrong}"], "wrong.json: entries.0: Input tag 'shout'"),
])
def test_what_chat_refuses_it_names(run_dir, tmp_path, arguments, message):
    (tmp_path / "bad.json").write_text("# not json")
    (tmp_path / "wrong.json").write_text(json.dumps({
        "format": "mascot-chat-transcript", "version": 1, "run": "r", "group": "g", "domain": "emotional_support",
        "personas": [], "seed": 0, "notice": "n", "entries": [{"type": "shout", "text": "hi"}]}))
    filled = [a.format(tmp=tmp_path, run=run_dir, bad=tmp_path / "bad.json", wrong=tmp_path / "wrong.json")
              for a in arguments]
    result = subprocess.run([MASCOT, "chat", *filled], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in " ".join(result.stderr.split()), result.stderr
