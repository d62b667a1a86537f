"""`mascot chat RUN --web`: the trained group in a local web page (FastAPI and plain HTML/JS, no build step).

Each browser tab opens a conversation of its own (`POST /api/sessions`). A message goes to
`POST /api/sessions/{id}/messages`, whose answer is the exchange's events as server-sent events, the
same events the terminal renders (`mascot.chat.session`): replies arrive as they are generated. One
event loop serves every tab and every request of the models is asynchronous, so a tab whose group is
still answering, or that reads its stream slowly, holds up no other tab; the in-process models decode
the tabs' requests in one batch.

Everything is bounded: a message's length in characters, counted once the JSON is parsed, and apart from
it a request body's size in bytes (`body_limit`: room for every character to be escaped), the messages of a
conversation, and the conversations open at once (`chat.max_sessions`; one idle for `chat.session_idle_s` is
dropped). Only the page itself can drive the API (`cli.web.guard`: the Host names it is served at, the
Origin of every POST, JSON bodies only). There is no authentication: the server binds to 127.0.0.1 unless
told otherwise (docs/chat.md says how to put it behind a reverse proxy that authenticates).

With a transcript instead of a group (`--replay`), the same page shows that conversation, read-only.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cli.web import STATIC
from cli.web.guard import LOOPBACK_NAMES, LocalPageGuard
from mascot.chat.session import ChatLimitError, ChatSession, CompanionGroup
from mascot.chat.transcript import Transcript, persona_views
from mascot.llm import BackendError

MAX_TURNS = 8
# JSON may escape every character: `\u00e9` is 6 bytes for one character, and one outside the Basic
# Multilingual Plane (an emoji) is a surrogate pair, `\ud83d\ude00`, 12 bytes. Python's json.dumps and
# `requests` escape all non-ASCII text by default, so the byte limit must leave room for that.
BYTES_PER_CHAR = 12
BODY_OVERHEAD = 1024  # the keys, the turns, whitespace


def body_limit(max_message_chars: int) -> int:
    """The largest request body a message may come in, in bytes; the message's own limit is in characters."""
    return BYTES_PER_CHAR * max_message_chars + BODY_OVERHEAD


class MessageBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    turns: int | None = Field(default=None, ge=1, le=MAX_TURNS)


@dataclass
class OpenSession:
    session: ChatSession
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    used: float = field(default_factory=time.monotonic)


class Sessions:
    """The conversations open now, at most `limit`; one idle for `idle_s` makes way for a new one."""

    def __init__(self, group: CompanionGroup, limit: int, idle_s: float, seed: int | None):
        self.group, self.limit, self.idle_s, self.seed = group, limit, idle_s, seed
        self.open: dict[str, OpenSession] = {}
        self.started = 0

    def start(self) -> str:
        now = time.monotonic()
        for key in [k for k, s in self.open.items() if now - s.used > self.idle_s and not s.busy.locked()]:
            del self.open[key]
        if len(self.open) >= self.limit:
            raise HTTPException(429, f"{self.limit} conversations are open already (chat.max_sessions); close "
                                     "another tab, or wait until one has been idle for "
                                     f"{self.idle_s:g} s")
        key = secrets.token_urlsafe(16)
        seed = None if self.seed is None else self.seed + self.started  # each tab a conversation of its own
        self.open[key] = OpenSession(ChatSession(self.group, seed))
        self.started += 1
        return key

    def get(self, key: str) -> OpenSession:
        if key not in self.open:
            raise HTTPException(404, "no such conversation: it was closed or dropped after being idle; reload "
                                     "the page to start a new one")
        entry = self.open[key]
        entry.used = time.monotonic()
        return entry


def group_info(group: CompanionGroup) -> dict:
    return {"group": group.roster.name, "domain": group.roster.domain, "run": group.name,
            "personas": [p.model_dump() for p in persona_views(group.roster)], "notice": group.rules.notice,
            "turns": group.turns, "max_turns": MAX_TURNS, "max_message_chars": group.max_message_chars,
            "replay": False}


def download(transcript: Transcript, format: str):
    """The transcript as a file to save: JSON (what --replay reads) or Markdown."""
    if format == "md":
        return PlainTextResponse(transcript.markdown(), media_type="text/markdown",
                                 headers={"Content-Disposition": 'attachment; filename="transcript.md"'})
    if format != "json":
        raise HTTPException(422, f"format={format!r}: expected json or md")
    return JSONResponse(json.loads(transcript.model_dump_json()),
                        headers={"Content-Disposition": 'attachment; filename="transcript.json"'})


def chat_app(group: CompanionGroup | None = None, *, replay: Transcript | None = None, max_sessions: int = 8,
             session_idle_s: float = 1800.0, seed: int | None = None, names=LOOPBACK_NAMES) -> FastAPI:
    """The page and its API for `group`, or a read-only page showing `replay`, answering to the Host `names`."""
    app = FastAPI(title="mascot chat", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(LocalPageGuard, names=names)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    sessions = Sessions(group, max_sessions, session_idle_s, seed) if group is not None else None

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "chat.html")

    @app.get("/api/group")
    async def info() -> dict:
        if replay is not None:
            return {"group": replay.group, "domain": replay.domain, "run": replay.run, "notice": replay.notice,
                    "personas": [p.model_dump() for p in replay.personas], "replay": True}
        return group_info(group)

    @app.get("/api/replay")
    async def replayed(format: str = "json"):
        if replay is None:
            raise HTTPException(404, "this page serves a live group, not a replay")
        return download(replay, format)

    def live() -> Sessions:
        if sessions is None:
            raise HTTPException(409, "this page replays a transcript; start `mascot chat RUN --web` to talk")
        return sessions

    @app.post("/api/sessions")
    async def start() -> dict:
        return {"id": live().start()}

    @app.post("/api/sessions/{key}/messages")
    async def message(key: str, request: Request) -> StreamingResponse:
        entry = live().get(key)
        limit, raw = body_limit(group.max_message_chars), bytearray()
        async for chunk in request.stream():  # read no further than the limit, whatever content-length says
            raw += chunk
            if len(raw) > limit:
                raise HTTPException(413, f"the request is over {limit} bytes; a message may have at most "
                                         f"{group.max_message_chars} characters")
        try:
            body = MessageBody.model_validate_json(bytes(raw))
        except ValidationError as exc:
            raise HTTPException(422, f"expected {{\"text\": ..., \"turns\": 1-{MAX_TURNS} or null}}: "
                                     f"{exc.errors()[0]['msg']}") from None
        if entry.busy.locked():
            raise HTTPException(409, "the group is still answering this conversation's last message")
        try:
            entry.session.check(body.text)
        except ChatLimitError as exc:
            raise HTTPException(422, str(exc)) from None
        await entry.busy.acquire()
        return StreamingResponse(events(entry, body), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def events(entry: OpenSession, body: MessageBody) -> AsyncIterator[str]:
        try:
            async for event in entry.session.send(body.text, body.turns):
                yield f"data: {json.dumps(event)}\n\n"
        except (BackendError, ChatLimitError) as exc:
            yield f"data: {json.dumps({'type': 'error', 'message': str(exc)})}\n\n"
        finally:
            entry.used = time.monotonic()
            entry.busy.release()
        yield f"data: {json.dumps({'type': 'done'})}\n\n"

    @app.post("/api/sessions/{key}/reset")
    async def reset(key: str) -> dict:
        entry = live().get(key)
        if entry.busy.locked():
            raise HTTPException(409, "the group is still answering; reset when it has finished")
        entry.session.reset()
        return {"reset": True}

    @app.post("/api/sessions/{key}/close")
    async def close(key: str) -> dict:
        live().open.pop(key, None)
        return {"closed": True}

    @app.get("/api/sessions/{key}/transcript")
    async def transcript(key: str, format: str = "json"):
        return download(live().get(key).session.transcript, format)

    return app
