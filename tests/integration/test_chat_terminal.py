"""`mascot chat` in a terminal, driven through a pseudo-terminal as a person would type, on a run directory with
the tiny profile's Speaker and Director in process; and what it refuses, with the reason."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pexpect
import pytest
import yaml
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
    (["{run}", "--config", "{moderated}"], "MASCOT_TEST_UNSET_KEY is not set"),
])
def test_what_chat_refuses_it_names(run_dir, tmp_path, arguments, message):
    (tmp_path / "bad.json").write_text("# not json")
    # The run's own config with OpenAI's moderation asked about every message, and no key for it in the environment.
    config = json.loads((run_dir / "manifest.json").read_text())["config"]
    config.setdefault("chat", {}).setdefault("safety", {})["moderation"] = {
        "kind": "openai_moderation", "model": "omni-moderation-2024-09-26", "api_key_env": "MASCOT_TEST_UNSET_KEY"}
    (tmp_path / "moderated.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "wrong.json").write_text(json.dumps({
        "format": "mascot-chat-transcript", "version": 1, "run": "r", "group": "g", "domain": "emotional_support",
        "personas": [], "seed": 0, "notice": "n", "entries": [{"type": "shout", "text": "hi"}]}))
    filled = [a.format(tmp=tmp_path, run=run_dir, bad=tmp_path / "bad.json", wrong=tmp_path / "wrong.json",
                       moderated=tmp_path / "moderated.yaml") for a in arguments]
    result = subprocess.run([MASCOT, "chat", *filled], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in " ".join(result.stderr.split()), result.stderr


# Text that rich would read as markup ([/red] crashed the replay; [bold] styled the rest), a Markdown link whose text
# is a helpline's name, and an ANSI sequence that would clear the screen: each must reach the screen as written.
NASTY = "[/red] [bold]kept [988 Lifeline](https://988lifeline.org) \x1b[2Jwiped"
SHOWN = ["[/red] [bold]kept", "[988 Lifeline](https://988lifeline.org)", "\\x1b[2Jwiped"]


WIDE = {**os.environ, "COLUMNS": "250"}  # each text on one line of the screen, whatever pytest's COLUMNS says


def nasty_transcript(folder):
    from mascot.chat.transcript import (
        CrisisEntry,
        DirectiveView,
        ReplyEntry,
        Transcript,
        UserEntry,
        persona_views,
    )

    transcript = Transcript(run=str(folder), group=ROSTER.name, domain=ROSTER.domain, personas=persona_views(ROSTER),
                            seed=0, notice=f"notice {NASTY}")
    transcript.entries += [UserEntry(text=f"user {NASTY}"),
                           ReplyEntry(speaker="beacon", name="The Beacon", text=f"reply {NASTY}",
                                      directive=DirectiveView(speaker="beacon", instruction=NASTY, fallback=False,
                                                              attempts=1)),
                           CrisisEntry(text=f"crisis {NASTY}")]
    return transcript


def screen_of(raw: str) -> str:
    assert "\x1b[2J" not in raw, "an escape sequence from the text reached the terminal"
    return " ".join(ANSI.sub("", raw).split())


def test_replay_prints_text_as_text_never_as_markup(tmp_path):
    path, _ = nasty_transcript(tmp_path).save(tmp_path / "nasty.json")
    replay = pexpect.spawn(MASCOT, ["chat", "--replay", str(path)], encoding="utf-8", timeout=60,
                           dimensions=(60, 250), env=WIDE)
    replay.expect(pexpect.EOF)
    replay.close()
    assert replay.exitstatus == 0, replay.before
    screen = screen_of(replay.before)
    for where in ("notice", "you: user", "The Beacon: reply", "crisis"):
        assert f"{where} {' '.join(SHOWN)}" in screen, (where, screen)


def test_the_live_terminal_prints_the_rules_texts_as_text(run_dir, tmp_path):
    from mascot.chat.safety import DEFAULT_RULES

    # A custom rules file: the shipped one with its notice and crisis answer replaced (only those two texts).
    rules = yaml.safe_load(DEFAULT_RULES.read_text())
    rules |= {"notice": f"notice {NASTY}", "crisis_reply": f"crisis {NASTY}"}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = yaml.safe_load((run_dir.parents[1] / "chat.yaml").read_text())
    config["chat"]["safety"] = {"rules": str(tmp_path / "rules.yaml")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    chat = pexpect.spawn(MASCOT, ["chat", str(run_dir), "--config", str(tmp_path / "config.yaml"), "--seed", "1"],
                         encoding="utf-8", timeout=180, dimensions=(60, 250), env=WIDE)
    chat.expect_exact(PROMPT)
    assert f"notice {' '.join(SHOWN)}" in screen_of(chat.before), chat.before
    chat.sendline("I want to end it all")
    chat.expect_exact(PROMPT)
    answer = screen_of(chat.before)
    assert "Safety guard" in answer and f"crisis {' '.join(SHOWN)}" in answer, answer
    chat.sendline("/quit")
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


def test_a_reply_by_a_speaker_outside_the_transcripts_roster_is_refused(tmp_path):
    stranger = nasty_transcript(tmp_path).model_dump(mode="json")
    stranger["entries"][1]["speaker"] = "ghost"  # a reply by someone outside the transcript's own roster
    (tmp_path / "stranger.json").write_text(json.dumps(stranger))
    result = subprocess.run([MASCOT, "chat", "--replay", str(tmp_path / "stranger.json")], check=False,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (f"{tmp_path / 'stranger.json'}: entries.1.speaker: 'ghost' is not a persona of this transcript; expected "
            "one of its personas: anchor, catalyst, beacon") in " ".join(result.stderr.split()), result.stderr
    assert "The Beacon" not in result.stdout, "nothing of it was shown"
    painted = nasty_transcript(tmp_path).model_dump(mode="json")
    painted["personas"][0]["color"] = "[red"  # a replay styles names with it: rich would fail on it mid-replay
    (tmp_path / "painted.json").write_text(json.dumps(painted))
    result = subprocess.run([MASCOT, "chat", "--replay", str(tmp_path / "painted.json")], check=False,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "painted.json: personas.0.color" in result.stderr, result.stderr
