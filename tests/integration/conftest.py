"""Shared integration fixtures: `transformers serve` with the tiny model on a loopback port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 120
CHAT_REQUEST_LINE = '"POST /v1/chat/completions HTTP/1.1" 200'


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerLog:
    def __init__(self, path: Path):
        self.path = path

    def text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def chat_requests(self) -> int:
        return self.text().count(CHAT_REQUEST_LINE)

    def wait_for_chat_requests(self, expected: int, timeout_s: float = 5.0) -> int:
        """The count once it reaches `expected` (or whatever it is at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.chat_requests() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.chat_requests()


@pytest.fixture(scope="session")
def served(tiny_models, tmp_path_factory):
    """`transformers serve` pinned to the tiny LM on a free loopback port; yields (model, url, log)."""
    model = str(tiny_models.lm)
    port = free_port()
    log = ServerLog(tmp_path_factory.mktemp("transformers-serve") / "server.log")
    # Unbuffered, so uvicorn's access lines (on stdout) reach the log as each request is answered.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", model,
               "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    with running(command, env, log, f"http://127.0.0.1:{port}/health"):
        yield model, f"http://127.0.0.1:{port}/v1", log


@contextmanager
def running(command: list[str], env: dict[str, str], log: ServerLog, health_url: str) -> Iterator[None]:
    """A server process, its output in `log`, for the duration of the block once it answers `health_url`."""
    with log.path.open("wb") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_until_healthy(server, health_url, log)
        yield
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)


def _wait_until_healthy(server: subprocess.Popen, health_url: str, log: ServerLog) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"{server.args[0]} exited with code {server.returncode}; its log:\n{log.text()[-4000:]}")
        try:
            with urllib.request.urlopen(health_url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    pytest.fail(f"{server.args[0]} did not answer {health_url} within {STARTUP_TIMEOUT_S} s; "
                f"its log:\n{log.text()[-4000:]}")




@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """`prefect server start` on a free loopback port, with a home of its own; yields its API URL.

    Flows started with PREFECT_API_URL set to it skip the temporary server's start-up, as a user
    who keeps a server running does.
    """
    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = ServerLog(home / "server.log")
    command = [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
               "--port", str(port), "--no-ui"]
    with running(command, env, log, f"http://127.0.0.1:{port}/api/health"):
        yield f"http://127.0.0.1:{port}/api"


@pytest.fixture(scope="session")
def chat_run(tiny_models, tmp_path_factory):
    """A run directory `mascot chat` can talk to: the tiny profile's config, an untrained Speaker and Director."""
    from chat_runs import group_run

    return group_run(tmp_path_factory.mktemp("chat"), tiny_models)
