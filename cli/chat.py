"""`mascot chat RUN_DIR`: talk to a trained companion group, in the terminal or in a local web page.

    mascot chat runs/tiny                       the terminal: /who /why /reset /save PATH /quit
    mascot chat runs/tiny --web                 a local web page at http://127.0.0.1:8765
    mascot chat --replay talk.json [--web]      a saved conversation, rendered again

The terminal renders the events of `mascot.chat.session` with rich: each persona in its colour, a
reply growing as it streams, the guard's answers in a red panel. Every text a person, a model or a rules
file wrote goes through `plain`: printed as text, never read as rich markup (a `[/red]` in a reply would
crash the chat, and a Markdown link in a crisis answer would lose its text), with its control characters
shown, not sent to the terminal (an ANSI sequence in a reply could restyle or clear the screen).
"""

from __future__ import annotations

import asyncio
import unicodedata
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cli.common import console, errors, fail
from cli.web import AllowHostOption, AllowRemoteOption, HostOption, PortOption

COMMANDS = {
    "/who": "the companions taking part",
    "/why": "why the last answer: the Director's directive behind a reply, or the guard's categories and rules",
    "/reset": "start a new conversation with the same group",
    "/save PATH": "write the transcript as PATH.json (for --replay) and PATH.md",
    "/help": "these commands",
    "/quit": "leave (Ctrl-D too)",
}


def chat(
    run_dir: Annotated[Path | None, typer.Argument(help="A run directory with a finished Stage 2, e.g. runs/tiny.")] = None,
    personas: Annotated[str | None, typer.Option(help="Comma-separated persona ids to take part (default: the "
                                                      "whole roster), e.g. anchor,beacon.")] = None,
    turns: Annotated[int | None, typer.Option(min=1, max=8, help="Companion turns after each of your messages "
                                              "(default: chat.turns of the config, 2).")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Take the chat section (backends, safety, "
                                                "limits) from this config instead of the run's recorded one.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed the conversation's requests, to play it again the same "
                                             "way (default: a new seed each time).")] = None,
    replay: Annotated[Path | None, typer.Option(help="Render a saved transcript (PATH.json from /save) instead "
                                                "of talking.")] = None,
    web: Annotated[bool, typer.Option("--web", help="Serve a local web page instead of the terminal.")] = False,
    host: HostOption = "127.0.0.1",
    port: PortOption = 8765,
    allow_remote: AllowRemoteOption = False,
    allow_host: AllowHostOption = None,
):
    """Talk to the companion group trained in RUN_DIR: the trained Director picks who speaks, and each persona
    replies in its own voice, streamed. Messages that suggest a crisis are answered with crisis resources
    instead. This is a research companion, not a clinician or a crisis service."""
    from mascot.chat.transcript import TranscriptError, load_transcript

    if (run_dir is None) == (replay is None):
        fail("give a run directory to talk to its group, or --replay TRANSCRIPT.json to render a saved conversation")
    if web:
        from cli.web import check_host, serve
        from cli.web.guard import served_names

        check_host(host, allow_remote)
        names = served_names(host, allow_host or ())
    if replay is not None:
        try:
            transcript = load_transcript(replay)
        except TranscriptError as exc:
            fail(exc)
        if web:
            from cli.web.chat_app import chat_app

            serve(chat_app(replay=transcript, names=names), host, port, f"the conversation in {replay}")
        else:
            render_transcript(transcript)
        return

    chat_config, group = load_chat(run_dir, personas, turns, config)
    if web:
        from cli.web.chat_app import chat_app

        serve(chat_app(group, max_sessions=chat_config.max_sessions, session_idle_s=chat_config.session_idle_s,
                       seed=seed, names=names), host, port, f"the group trained in {run_dir}")
    else:
        asyncio.run(terminal(group, seed))


def load_chat(run_dir: Path, personas: str | None, turns: int | None, config: Path | None):
    """The chat section in use and the group, or a clean exit naming what is missing."""
    from mascot.artifacts import ArtifactChanged
    from mascot.chat.group import load_group, run_config
    from mascot.llm import MissingAPIKey
    from mascot.yamlio import ConfigError

    ids = [p.strip() for p in personas.split(",") if p.strip()] if personas else None
    try:
        if config is not None:
            from cli.common import load

            chat_config = load(config).chat
        else:
            chat_config = run_config(run_dir).chat
        with console.status("loading the group's models"):
            return chat_config, load_group(run_dir, personas=ids, turns=turns, chat=chat_config)
    except (FileNotFoundError, ValueError, ArtifactChanged, ConfigError, MissingAPIKey) as exc:
        fail(exc)


# The terminal.

def visible(text: str) -> str:
    """`text` with each control character but newline and tab written out (ESC as \\x1b), so the terminal shows it
    and does not obey it."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else ascii(c)[1:-1] for c in text)


def plain(text: str, look: str = "") -> Text:
    """Text from a person, a model or a rules file, as rich shows it: as text, never as markup."""
    return Text(visible(text), style=look)


def style(transcript, speaker: str) -> str:
    color = next((p.color for p in transcript.personas if p.id == speaker), "white")
    return f"bold {color}"


def show_notice(transcript) -> None:
    console.print(Panel(plain(transcript.notice), title="Before you start", border_style="yellow", expand=False))


def show_roster(transcript) -> None:
    table = Table(show_header=False, box=None, padding=(0, 1))
    for persona in transcript.personas:
        table.add_row(plain(persona.name, style(transcript, persona.id)), plain(persona.role), plain(persona.id, "dim"))
    console.print(table)


def show_crisis(text: str) -> None:
    console.print(Panel(plain(text), title="Safety guard", border_style="red"))


def show_reply(transcript, entry) -> None:
    line = plain(f"{entry.name}: ", style(transcript, entry.speaker)).append_text(plain(entry.text))
    console.print(line)


def show_why(transcript, entry) -> None:
    from mascot.chat.transcript import CrisisEntry

    if entry is None:
        console.print("no answer yet, so nothing to explain", style="dim")
    elif isinstance(entry, CrisisEntry):
        table = Table(show_header=False, box=None, padding=(0, 1), title="Why the safety guard answered",
                      title_justify="left")
        for what, why in entry.reasons():
            table.add_row(plain(what), plain(why))
        console.print(table)
    else:
        show_directive(transcript, entry)


def show_directive(transcript, entry) -> None:
    directive = entry.directive
    table = Table(show_header=False, box=None, padding=(0, 1), title="Why the last reply", title_justify="left")
    table.add_row("speaker", plain(transcript.name_of(directive.speaker), style(transcript, directive.speaker)))
    table.add_row("instruction", plain(directive.instruction))
    table.add_row("tone", plain(directive.tone or "(none)"))
    table.add_row("fallback", "yes: the Director gave no valid directive" if directive.fallback else "no")
    table.add_row("attempts", str(directive.attempts))
    if entry.discarded:
        table.add_row("guard", f"{entry.discarded} draft(s) discarded" + (", withheld" if entry.withheld else ""))
    console.print(table)


def render_transcript(transcript) -> None:
    from mascot.chat.transcript import CrisisEntry, ReplyEntry, UserEntry

    console.print(plain(f"{transcript.group}, run {transcript.run}, {transcript.started_at}", "bold"))
    show_notice(transcript)
    show_roster(transcript)
    for entry in transcript.entries:
        if isinstance(entry, UserEntry):
            console.print(Text("you: ", style="bold").append_text(plain(entry.text)))
        elif isinstance(entry, ReplyEntry):
            show_reply(transcript, entry)
        elif isinstance(entry, CrisisEntry):
            show_crisis(entry.text)
        else:
            console.rule("a new conversation", style="dim")


async def terminal(group, seed: int | None) -> None:
    from mascot.chat.session import ChatLimitError, ChatSession
    from mascot.llm import BackendError

    session = ChatSession(group, seed)
    transcript = session.transcript
    show_notice(transcript)
    show_roster(transcript)
    console.print("Type a message, or /help for the commands.", style="dim")
    while True:
        try:
            line = await asyncio.to_thread(console.input, "[bold]you ›[/bold] ")
        except (EOFError, KeyboardInterrupt):
            console.print()
            return
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if not command(session, line):
                return
            continue
        try:
            await exchange(session, line)
        except ChatLimitError as exc:
            errors.print(Text(str(exc), style="red"))
        except BackendError as exc:
            errors.print(Text(f"the group could not answer: {exc}", style="red"))


async def exchange(session, line: str) -> None:
    """One message and the group's answer, each reply growing in place as it streams."""
    transcript, live, text = session.transcript, None, None
    try:
        async for event in session.send(line):
            kind = event["type"]
            if kind == "crisis":
                show_crisis(event["text"])
            elif kind == "directive":
                text = plain(f"{transcript.name_of(event['speaker'])}: ", style(transcript, event["speaker"]))
                prefix = len(text)
                live = Live(text, console=console, auto_refresh=False, transient=False)
                live.start()
            elif kind == "delta":
                text.append_text(plain(event["text"]))
                live.refresh()
            elif kind == "discard":
                text.right_crop(len(text) - prefix)
                live.refresh()
            elif kind == "reply":
                live.stop()
                live = None
    finally:
        if live is not None:
            live.stop()


def command(session, line: str) -> bool:
    """Run a /command; False when it ends the chat."""
    name, _, argument = line.partition(" ")
    transcript = session.transcript
    if name in ("/quit", "/exit"):
        return False
    if name == "/who":
        show_roster(transcript)
    elif name == "/why":
        show_why(transcript, session.last_answer())
    elif name == "/reset":
        session.reset()
        console.rule("a new conversation", style="dim")
    elif name == "/save":
        if not argument.strip():
            errors.print(Text("/save needs a path, e.g. /save talk.json", style="red"))
        else:
            try:
                saved = transcript.save(Path(argument.strip()).expanduser())
            except OSError as exc:
                errors.print(Text(f"could not save: {exc}", style="red"))
            else:
                console.print(plain(f"saved {saved[0]} and {saved[1]}"), highlight=False, soft_wrap=True)
    else:
        if name != "/help":
            errors.print(plain(f"unknown command {name}", "red"))
        for usage, meaning in COMMANDS.items():
            console.print(Text(f"  {usage:<11}", style="bold").append(meaning))
    return True
