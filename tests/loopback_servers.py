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
