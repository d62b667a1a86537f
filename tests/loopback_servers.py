"""Real HTTP servers on 127.0.0.1 for backend tests: a FastAPI app served by uvicorn in a thread.

Importable from test modules because pytest puts `tests/` (the folder of the root conftest.py)
on sys.path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serve(app: FastAPI, port: int | None = None) -> Iterator[str]:
    """Run `app` until the block ends, on `port` or a free one; yields its root URL, http://127.0.0.1:<port>."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "loopback server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def end_process_group(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM a process started with start_new_session=True and everything it started; SIGKILL if it lingers."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class FileServer:
    """Files served over HTTP on 127.0.0.1 with Range support, for download tests (`serve_files`).

    `files` maps a URL path ("/esconv/ESConv.json") to its bytes and can change while serving.
    `cut_after[path] = n` sends the whole Content-Length but closes after n body bytes (a truncated
    download). `sent[path]` counts the body bytes sent and `ranges` the Range headers received, so a
    test can prove that a resumed download asked for, and got, only the rest.
    """

    def __init__(self, files: dict[str, bytes]):
        self.files = dict(files)
        self.cut_after: dict[str, int] = {}
        self.sent: dict[str, int] = {}
        self.ranges: list[tuple[str, str | None]] = []
        self.url = ""


@contextmanager
def serve_files(files: dict[str, bytes]) -> Iterator[FileServer]:
    """A `FileServer` (http.server in a thread) until the block ends; its `url` is http://127.0.0.1:<port>."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    state = FileServer(files)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name for the GET handler
            body = state.files.get(self.path)
            asked = self.headers.get("Range")
            state.ranges.append((self.path, asked))
            if body is None:
                self.send_error(404)
                return
            start = int(asked.removeprefix("bytes=").rstrip("-")) if asked else 0
            if start >= len(body) and asked:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            part = body[start:]
            self.send_response(206 if asked else 200)
            if asked:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.send_header("Content-Length", str(len(part)))
            self.end_headers()
            part = part[: state.cut_after[self.path]] if self.path in state.cut_after else part
            # Counted before the write: the client can read the last byte, and the test assert, before this thread
            # would get past the write to count it.
            state.sent[self.path] = state.sent.get(self.path, 0) + len(part)
            self.wfile.write(part)
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args):  # keep the test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
