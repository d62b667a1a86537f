"""Which Prefect server a `mascot run` reports to: the one at PREFECT_API_URL, or a temporary one.

Without PREFECT_API_URL, Prefect starts a temporary server itself once the flow begins. It imports
its whole server package to do so (1.7 s and 100 MB in our process), and only then starts the
server, which takes seconds more. `prefect_server` starts the same server the same way (the command
and variables of Prefect's `SubprocessASGIServer`), before this process imports Prefect: the
server's start-up overlaps ours on another core, and our process never loads the server's code.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from mascot.redaction import redact_url

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# A small machine needs longer than Prefect's default to start the server (and to create its database).
STARTUP_TIMEOUT_S = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60"))
KEEP_ONE_RUNNING = ("keep one running with `mascot server start` and set PREFECT_API_URL to the address it "
                    "prints (see docs/cli.md)")


class PrefectServerError(RuntimeError):
    pass


@dataclass
class PrefectServer:
    url: str
    temporary: bool
    process: subprocess.Popen | None = None

    def wait(self) -> None:
        """Until the server answers; a temporary one may still be starting."""
        deadline = time.monotonic() + (STARTUP_TIMEOUT_S if self.temporary else 5)
        while not answers(self.url):
            if not self.temporary:
                raise PrefectServerError(
                    f"PREFECT_API_URL is {redact_url(self.url)}, but no Prefect server answers there. "
                    f"{_how_to_start(self.url)}, or unset PREFECT_API_URL to use a temporary one.")
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise PrefectServerError(
                    f"the temporary Prefect server did not start within {STARTUP_TIMEOUT_S:g} s (exit code "
                    f"{self.process.poll()}). Raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or "
                    f"{KEEP_ONE_RUNNING}.")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop a temporary server; its database stays in PREFECT_HOME, as Prefect's own temporary server's does."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def describe(self) -> str:
        if self.temporary:
            return (f"Prefect server: a temporary one at {self.url}, for this run only (its start-up costs "
                    f"seconds; to skip it, {KEEP_ONE_RUNNING})")
        return f"Prefect server: {redact_url(self.url)} (PREFECT_API_URL)"


def prefect_server() -> PrefectServer:
    """The server to report to. A temporary one is started now, and stopped when the process exits.

    Call it before anything imports Prefect: it sets PREFECT_API_URL for this process. The stop waits
    for Python's exit, after Prefect's own exit hooks, which still send the run's last logs and events.
    """
    url = configured_api_url()
    if url:
        return PrefectServer(url, temporary=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = PrefectServer(f"http://127.0.0.1:{port}/api", temporary=True)
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
    server.process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"],
        env=env, stdin=subprocess.DEVNULL)
    atexit.register(server.stop)
    os.environ["PREFECT_API_URL"] = server.url
    return server


def _how_to_start(url: str) -> str:
    """Advice that can fix an unanswered PREFECT_API_URL: a command for a server on this machine."""
    parts = urlsplit(url)
    if parts.hostname in LOOPBACK:
        return f"Start one there with `mascot server start --port {parts.port or 80}`"
    return "Start the server at that address"


def answers(url: str) -> bool:
    """Whether a Prefect API answers at `url` (ending in /api)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()


def configured_api_url() -> str | None:
    """PREFECT_API_URL from the environment, else from the active Prefect profile."""
    return os.environ.get("PREFECT_API_URL") or _profile_api_url()


def _profile_api_url() -> str | None:
    """PREFECT_API_URL from the active Prefect profile (`prefect config set`), read without importing Prefect."""
    path = Path(os.environ.get("PREFECT_PROFILES_PATH", prefect_home() / "profiles.toml")).expanduser()
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    url = profiles.get("profiles", {}).get(active, {}).get("PREFECT_API_URL")
    return url if isinstance(url, str) and url else None
