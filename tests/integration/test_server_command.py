"""`mascot server start|stop|status`, run as a user runs them, each from a shell that exits at once.

What happened is read from outside the command: the process table, whether the port answers, and
whether the port is free again.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from loopback_servers import free_port

pytestmark = pytest.mark.integration

MASCOT = str(Path(sys.executable).parent / "mascot")


def environment(home: Path) -> dict[str, str]:
    # The caller's server settings must not reach the servers these tests start.
    env = {k: v for k, v in os.environ.items() if k not in {"PREFECT_API_URL", "PREFECT_SERVER_API_PORT",
                                                            "PREFECT_UI_API_URL", "PREFECT_SERVER_UI_API_URL"}}
    return {**env, "PREFECT_HOME": str(home)}


def mascot_server(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([MASCOT, "server", *arguments], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def said(done: subprocess.CompletedProcess) -> str:
    return " ".join((done.stdout + done.stderr).split())


def servers_on(port: int) -> list[int]:
    """Pids of Prefect server processes started for `port`, from the process table."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and b"prefect" in command and b"server" in command and str(port).encode() in command:
            found.append(int(proc.name))
    return found


def health(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_start_status_a_second_start_and_stop(tmp_path):
    env, port = environment(tmp_path / "prefect"), free_port()
    started = mascot_server(env, "start", "--port", str(port))
    assert started.returncode == 0, said(started)
    api = f"http://127.0.0.1:{port}/api"
    assert f"PREFECT_API_URL={api}" in said(started)
    [pid] = servers_on(port)
    assert (tmp_path / "prefect" / "server.log").exists()
    # The UI reads its API's address from the settings endpoint, as its page does at load: this server's,
    # not Prefect's default port (4200) that a server started with --port would otherwise hand it.
    ui = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).raise_for_status().json()
    assert ui["api_url"] == api, ui

    # The server outlives the command; the bug it replaces died at its next log line, within seconds.
    # A work pool is created (the server logs), and it still answers afterwards.
    created = subprocess.run([str(Path(sys.executable).parent / "prefect"), "work-pool", "create", "pool",
                              "--type", "process"], env={**env, "PREFECT_API_URL": api}, capture_output=True,
                             text=True, timeout=120, check=False)
    assert created.returncode == 0, said(created)
    time.sleep(3)
    assert health(port) and servers_on(port) == [pid]

    status = mascot_server(env, "status")
    assert status.returncode == 0 and f"{api} (pid {pid}) answers" in said(status), said(status)

    again = mascot_server(env, "start", "--port", str(port))
    assert again.returncode == 0 and "already answers" in said(again) and "nothing started" in said(again)
    assert servers_on(port) == [pid], "a second start started another server"

    other_port = free_port()
    elsewhere = mascot_server(env, "start", "--port", str(other_port))
    assert elsewhere.returncode == 1 and "mascot server stop" in said(elsewhere), said(elsewhere)
    assert servers_on(other_port) == []

    stopped = mascot_server(env, "stop")
    assert stopped.returncode == 0 and "stopped" in said(stopped), said(stopped)
    assert servers_on(port) == [] and not health(port) and port_is_free(port)
    down = mascot_server(env, "status")
    assert down.returncode == 1 and "none running" in said(down), said(down)
    assert "nothing to stop" in said(mascot_server(env, "stop"))


def test_a_port_taken_by_another_program_is_named_and_nothing_starts(tmp_path):
    env = environment(tmp_path / "prefect")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = mascot_server(env, "start", "--port", str(port))
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 is taken by a program that is not a Prefect server" in said(done)
    assert servers_on(port) == [] and not (tmp_path / "prefect" / "mascot-server.json").exists()


def test_a_server_that_dies_at_start_shows_the_end_of_its_log(tmp_path):
    env = {**environment(tmp_path / "prefect"),
           "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path}/missing/folder/prefect.db"}
    port = free_port()
    done = mascot_server(env, "start", "--port", str(port), "--log", str(tmp_path / "server.log"))
    assert done.returncode == 1
    assert "the Prefect server exited with code" in said(done) and "unable to open database file" in said(done)
    assert servers_on(port) == [] and not (tmp_path / "prefect" / "mascot-server.json").exists()


@pytest.mark.parametrize("where", ["environment", "profile"])
def test_a_ui_api_url_the_user_set_is_kept(tmp_path, where):
    """The server's environment, as `mascot server start` builds it, in a fresh process (Prefect reads its
    settings once per process): a UI API URL from the environment or the active profile stays the UI's."""
    home, chosen = tmp_path / "prefect", "https://prefect.example.org/api"
    env = {k: v for k, v in environment(home).items() if k not in {"PREFECT_PROFILE", "PREFECT_PROFILES_PATH"}}
    if where == "environment":
        env["PREFECT_UI_API_URL"] = chosen
    else:
        home.mkdir()
        (home / "profiles.toml").write_text(f'active = "mine"\n[profiles.mine]\nPREFECT_UI_API_URL = "{chosen}"\n')
    probe = ("from cli.server import server_environment; "
             "env, ui = server_environment('http://127.0.0.1:4322/api'); print(env.get('PREFECT_UI_API_URL'), ui)")
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                          check=True)
    kept = chosen if where == "environment" else "None"  # a profile's value reaches the server from the profile
    assert done.stdout.split() == [kept, chosen], done.stdout + done.stderr

