"""`mascot server start|stop|status`: Prefect's own server, kept running in the background.

Prefect 3.9's `prefect server start --background` starts uvicorn with its output on pipes that
nobody reads once the CLI has exited, and the server dies at its next log line. Here Prefect's own
foreground command (`python -m prefect server start`) runs detached instead: in a session of its
own, so it outlives the shell that started it, with its output in a log file. What only this module
adds is that detaching. A state file in PREFECT_HOME records the server's pid, address and log for
`stop` and `status`. There is one server per PREFECT_HOME, because servers in one home would share
its database.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Annotated

import typer

from cli.common import console, fail
from cli.prefect_server import STARTUP_TIMEOUT_S, answers, configured_api_url, prefect_home
from mascot.redaction import redact_url

server_app = typer.Typer(help="Keep a Prefect server running in the background (for runs, deployments and the UI).",
                         no_args_is_help=True)

STATE_FILE = "mascot-server.json"
LOG_TAIL_LINES = 25
STOP_TIMEOUT_S = 30


@server_app.command("start")
def start(
    host: Annotated[str, typer.Option(help="Address to listen on. Anything but loopback exposes an API without "
                                           "authentication to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="PREFECT_SERVER_API_PORT", min=1, max=65535,
                                      help="Port to listen on.")] = 4200,
    log: Annotated[Path | None, typer.Option(help="The server's log file (appended to). Default: "
                                                  "PREFECT_HOME/server.log.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the server to answer.")] = STARTUP_TIMEOUT_S,
):
    """Start Prefect's server in the background, wait until it answers, and print the PREFECT_API_URL to set.

    The server keeps running after this command and its shell exit, until `mascot server stop`.
    Its output goes to the log file, and its pid and address to PREFECT_HOME/mascot-server.json.
    """
    url = f"http://{_connect_host(host)}:{port}"
    api = f"{url}/api"
    state = _live_state()
    if state is not None:
        if state["api"] == api:
            console.print(f"a Prefect server started by `mascot server start` already answers at {api} (pid "
                          f"{state['pid']}); nothing started.", highlight=False, soft_wrap=True)
            _print_api_url(api)
            return
        fail(f"a Prefect server started by `mascot server start` already runs for PREFECT_HOME {prefect_home()} "
             f"at {state['api']} (pid {state['pid']}). Servers in one PREFECT_HOME would share its database: stop it "
             "with `mascot server stop`, or set PREFECT_HOME to another folder.", code=1)
    if answers(api):
        console.print(f"a Prefect server already answers at {api} (not started from PREFECT_HOME {prefect_home()}); "
                      "nothing started.", highlight=False, soft_wrap=True)
        _print_api_url(api)
        return
    if not _can_listen(host, port):
        fail(f"port {port} on {host} is taken by a program that is not a Prefect server (nothing answers at "
             f"{api}/health): choose another with --port, or stop that program.", code=1)

    log = (log or prefect_home() / "server.log").expanduser().resolve()
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
    env, ui_api = server_environment(api)
    with log.open("ab") as output:
        output.write(f"\n--- mascot server start: {' '.join(command)} ({time.strftime('%Y-%m-%d %H:%M:%S')})\n"
                     .encode())
        output.flush()
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                  env=env, start_new_session=True)
    with console.status(f"starting Prefect's server at {url} (log: {log})"):
        deadline = time.monotonic() + timeout
        while not answers(api):
            if server.poll() is not None or time.monotonic() > deadline:
                _end(server.pid)
                why = (f"exited with code {server.returncode}" if server.returncode is not None
                       else f"did not answer within {timeout:g} s")
                fail(f"the Prefect server {why}. The last lines of its log, {log}:\n{_tail(log)}", code=1)
            time.sleep(0.2)
    _write_state({"pid": server.pid, "api": api, "log": str(log)})
    console.print(f"[green]Prefect server running[/green] at {url} (pid {server.pid}); log: {log}",
                  highlight=False, soft_wrap=True)
    console.print(f"Its UI: {url} (it reaches the API at {redact_url(ui_api)})", highlight=False, soft_wrap=True)
    if host not in {"127.0.0.1", "localhost", "::1"}:
        console.print(f"[yellow]It listens on {host}: anyone who can reach this machine can use its API, which "
                      "has no authentication.[/yellow] A browser on another machine needs PREFECT_UI_API_URL set, "
                      "before the start, to the address at which it reaches the API.", soft_wrap=True)
    _print_api_url(api)
    console.print("Stop it with `mascot server stop`.", highlight=False)


@server_app.command("stop")
def stop(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for a clean shutdown before killing it.")]
    = STOP_TIMEOUT_S,
):
    """Stop the server that `mascot server start` started in this PREFECT_HOME, and wait until it is gone."""
    state = _read_state()
    if state is None:
        console.print(f"no server started by `mascot server start` in PREFECT_HOME {prefect_home()}; nothing to "
                      "stop.", highlight=False, soft_wrap=True)
        return
    pid = state["pid"]
    if not _is_prefect_server(pid):
        _state_path().unlink(missing_ok=True)
        console.print(f"the server at {state['api']} (pid {pid}) was not running; its state file is removed.",
                      highlight=False, soft_wrap=True)
        return
    gone = _end(pid, timeout)
    _state_path().unlink(missing_ok=True)
    how = "stopped" if gone else f"killed: it did not stop within {timeout:g} s of SIGTERM"
    console.print(f"Prefect server at {state['api']} (pid {pid}) {how}.", highlight=False, soft_wrap=True)


@server_app.command("status")
def status():
    """Say whether a Prefect server answers, where, and which one runs will report to. Exit 1 if none answers.

    Looks at the server that `mascot server start` started in this PREFECT_HOME, and at PREFECT_API_URL
    (from the environment or the active Prefect profile), which is where `mascot run` reports.
    """
    state = _live_state()
    configured = configured_api_url()
    answering = False
    if state is not None:
        up = answers(state["api"])
        answering |= up
        console.print(f"mascot server: {state['api']} (pid {state['pid']}) "
                      f"{'answers' if up else 'runs but does not answer'}; log: {state['log']}",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"mascot server: none running for PREFECT_HOME {prefect_home()}", highlight=False,
                      soft_wrap=True)
    if configured:
        up = answers(configured)
        answering |= up
        console.print(f"PREFECT_API_URL: {redact_url(configured)} {'answers' if up else 'does not answer'}",
                      highlight=False, soft_wrap=True)
        if state is not None and configured.rstrip("/") != state["api"]:
            console.print("  (not the mascot server's address: runs report to PREFECT_API_URL)", highlight=False)
    else:
        console.print("PREFECT_API_URL: not set, so each `mascot run` starts a temporary server", highlight=False)
    raise typer.Exit(0 if answering else 1)


def server_environment(api: str) -> tuple[dict[str, str], str]:
    """The server's environment, and the API URL its UI will use: this server's `api`, unless the user chose one.

    Prefect hands the UI PREFECT_UI_API_URL, else PREFECT_API_URL, else its default host and port (4200). So
    a server started with --port, or while PREFECT_API_URL (or the active profile) names another server,
    would serve a UI that talks to the wrong API. A UI API URL the user set, in the environment, a profile
    or a settings file, is kept: it is how a UI reached through a proxy or another host finds its API.
    """
    from prefect.settings import get_current_settings  # here only: `mascot run` must not import Prefect early

    ui = get_current_settings().server.ui
    if "api_url" in ui.model_fields_set:  # Prefect leaves a default it derived itself out of the set fields
        return dict(os.environ), ui.api_url
    return {**os.environ, "PREFECT_UI_API_URL": api}, api


def _print_api_url(api: str) -> None:
    console.print(f"Point runs, workers and deployments at it:  prefect config set PREFECT_API_URL={api}",
                  highlight=False, soft_wrap=True)


def _connect_host(host: str) -> str:
    """The address clients on this machine use for a server listening on `host`."""
    if host in {"0.0.0.0", ""}:
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _can_listen(host: str, port: int) -> bool:
    """Whether `host:port` is free, tried as the server will bind it (SO_REUSEADDR, as uvicorn does)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
        return True
    except OSError:
        return False


def _state_path() -> Path:
    return prefect_home() / STATE_FILE


def _read_state() -> dict | None:
    path = _state_path()
    try:
        state = json.loads(path.read_text())
        return {"pid": int(state["pid"]), "api": str(state["api"]), "log": str(state["log"])}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(f"{path} is not a state file written by `mascot server start` ({exc!r}). If no server runs, remove "
             "it; if one does, stop it by its pid.", code=1)


def _live_state() -> dict | None:
    """The recorded server, if it still runs; a stale record (a server killed another way) is removed."""
    state = _read_state()
    if state is not None and not _is_prefect_server(state["pid"]):
        _state_path().unlink(missing_ok=True)
        return None
    return state


def _write_state(state: dict) -> None:
    path = _state_path()
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(temporary, path)


def _is_prefect_server(pid: int) -> bool:
    """Whether `pid` is a live Prefect server: not gone, not a zombie, not a pid reused by another program.

    The server is not this process's child, so `os.kill(pid, 0)` alone would call a zombie (one that a
    container's init never reaps) alive.
    """
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            state = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
            command = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            return False
    else:  # macOS and the BSDs have no /proc
        shown = subprocess.run(["ps", "-o", "stat=,command=", "-p", str(pid)], capture_output=True, text=True,
                               check=False).stdout.split(None, 1)
        if len(shown) < 2:
            return False
        state, command = shown
    return not state.startswith("Z") and "prefect" in command and "server" in command


def _end(pid: int, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the server's session (the server and anything it started), SIGKILL it after `timeout`.

    True if it went on SIGTERM."""
    for sent, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sent)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while _is_prefect_server(pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        else:
            return sent == signal.SIGTERM
    return False


def _tail(log: Path) -> str:
    with log.open(errors="replace") as lines:
        return "".join(deque(lines, maxlen=LOG_TAIL_LINES)).rstrip()
