"""The local web pages: chat with a trained group (`chat_app`) and blind human rating (`rating_app`).

Plain HTML, CSS and JavaScript in `static/`, served by FastAPI as they are: there is no build step.
"""

import ipaddress
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from cli.common import console, errors, fail

STATIC = Path(__file__).with_name("static")

HostOption = Annotated[str, typer.Option(help="--web: the address to listen on.")]
PortOption = Annotated[int, typer.Option(min=1, max=65535, help="--web: the port to listen on.")]
AllowHostOption = Annotated[list[str] | None, typer.Option(
    "--allow-host", help="--web: a further Host name the page answers to, such as the public name of the reverse "
                         "proxy in front of it (repeat for more); any other name is refused (docs/chat.md).")]
AllowRemoteOption = Annotated[bool, typer.Option(
    "--allow-remote", help="--web: allow --host to be other than loopback. The page has no authentication: put it "
                           "behind a reverse proxy that has one (docs/chat.md).")]


def check_host(host: str, allow_remote: bool) -> None:
    """Loopback goes; anything else only with --allow-remote, and with a warning."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return
    if not allow_remote:
        fail(f"--host {host} would let other machines reach the page, which has no authentication; pass "
             "--allow-remote as well if that is what you want (docs/chat.md: behind a reverse proxy that "
             "authenticates)")
    errors.print(Text(f"warning: serving on {host} with no authentication: anyone who can reach this port can use the "
                      "page. Put it behind a reverse proxy that authenticates (docs/chat.md).", style="yellow"))


def serve(app, host: str, port: int, what: str) -> None:
    """Serve `app` until Ctrl-C."""
    import uvicorn

    shown = f"[{host}]" if ":" in host else host
    console.print(f"serving {what} at http://{shown}:{port} (Ctrl-C stops it)", highlight=False, soft_wrap=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
