"""A loopback HTTP proxy that injects faults in front of an OpenAI-compatible server, at a rate you set.

    with FaultProxy(upstream="http://127.0.0.1:8123", rate=0.2) as proxy:   # proxy.url, proxy.faults
        ...
        proxy.rate = 1.0  # an outage; 0 when the backend is back

Each request it receives draws, from a seeded generator, whether it fails and how:

- `500`: an HTTP 500 with an error body;
- `429`: an HTTP 429 with `Retry-After: 1`, as a rate-limited API answers;
- `timeout`: no answer for `hang_s` seconds (longer than the client's timeout), then the connection closes;
- `drop`: the connection closes without a byte of answer;
- `truncated`: a 200 whose body stops after a few bytes of its announced length.

A faulted request never reaches the server: what the server counts is what it answered, so a request the
client retries after a fault is answered once. Every other request is forwarded as it came and its answer
relayed. It speaks plain HTTP/1.1 over asyncio streams (a proxy on a web framework could not drop a
connection or cut a body short), on a thread and event loop of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
from collections import Counter
from typing import Self

import httpx
from loopback_servers import free_port

KINDS = ("500", "429", "timeout", "drop", "truncated")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}


class FaultProxy:
    def __init__(self, upstream: str, rate: float, *, seed: int = 0, hang_s: float = 3.0,
                 kinds: tuple[str, ...] = KINDS):
        self.upstream, self.rate, self.hang_s, self.kinds = upstream.rstrip("/"), rate, hang_s, kinds
        self.random = random.Random(seed)
        self.faults: Counter[str] = Counter()
        self.forwarded = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        self._client = httpx.AsyncClient(timeout=None)
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        self._server.close()
        await self._client.aclose()

    def _draw(self) -> str | None:
        return self.random.choice(self.kinds) if self.random.random() < self.rate else None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await _read_request(reader)) is not None:
                fault = self._draw()
                if fault is None:
                    await self._forward(request, writer)
                    continue
                self.faults[fault] += 1
                if fault in ("500", "429"):
                    headers = {"Retry-After": "1"} if fault == "429" else {}
                    message = "injected fault: rate limited" if fault == "429" else "injected fault: server error"
                    await _respond(writer, int(fault), {"error": {"message": message, "type": "server_error"}},
                                   headers)
                    continue
                if fault == "timeout":
                    await asyncio.sleep(self.hang_s)
                elif fault == "truncated":
                    body = json.dumps({"id": "cut", "object": "chat.completion", "choices": []}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n" % (len(body) + 100) + body[:12])
                    await writer.drain()
                break  # drop, timeout and truncated end the connection
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _forward(self, request: tuple[str, str, dict, bytes], writer: asyncio.StreamWriter) -> None:
        method, path, headers, body = request
        answer = await self._client.request(method, self.upstream + path, content=body,
                                            headers={k: v for k, v in headers.items() if k not in HOP_BY_HOP
                                                     and k != "host"})
        self.forwarded += 1
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        await _respond(writer, answer.status_code, answer.content, kept)


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict, bytes] | None:
    """One HTTP/1.1 request (the OpenAI client sends a Content-Length), or None at the end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {name.strip().lower(): value.strip() for name, value in
               (line.split(":", 1) for line in lines[1:] if ":" in line)}
    body = await reader.readexactly(int(headers.get("content-length", 0)))
    return method, path, headers, body


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes | dict, headers: dict) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    lines = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}", f"Content-Length: {len(data)}",
             *(f"{name}: {value}" for name, value in headers.items())]
    if not any(name.lower() == "content-type" for name in headers):
        lines.append("Content-Type: application/json")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
    await writer.drain()
