"""What keeps a local page's API to its own page: the standard defences of a server on a person's machine.

A browser lets any site it has open send requests to 127.0.0.1. Two attacks follow, and one check each
stops them, before any endpoint runs:

- **DNS rebinding.** A site makes its own name resolve to 127.0.0.1, so that its page can read this
  server's answers as its own. Its requests carry its name in the Host header, so only the names the
  server is bound to (`served_names`) are accepted; any other Host is refused with 403.
- **Cross-site requests (CSRF).** A page of another site posts to this server (it cannot read the answer,
  but it can start conversations or record ratings). A browser names the sending page in the Origin
  header of every POST, so a request whose Origin is not this page's own (the scheme and the Host it was
  sent to) is refused with 403; and every POST must be `Content-Type: application/json` (else 415): a
  form or a "simple" cross-site request cannot send that type without the browser first asking the
  server's permission (CORS), which it never gives.

A request with no Origin (curl, a script) is let through: it is no browser page acting for someone else.
None of this is authentication; docs/chat.md says what needs the reverse proxy.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def served_names(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host names a page bound to `host` answers to: that address (with the other loopback names, when it is
    loopback), and `extra` (--allow-host: a reverse proxy's public name, say)."""
    names = {host.strip("[]").lower(), *(name.lower() for name in extra)}
    return frozenset(names | set(LOOPBACK_NAMES) if is_loopback(host.strip("[]")) else names)


def _hostname(netloc: str) -> str | None:
    try:
        return urlsplit(f"//{netloc}").hostname
    except ValueError:
        return None


class LocalPageGuard:
    """ASGI middleware: refuse a request to a Host not in `names` (403), a write whose Origin is another site's
    (403), and a write that is not JSON (415), each with a `detail` that says why."""

    def __init__(self, app: ASGIApp, names: Iterable[str] = LOOPBACK_NAMES):
        self.app, self.names = app, frozenset(names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refusal := self.refusal(Headers(scope=scope), scope["method"])):
            await JSONResponse({"detail": refusal[1]}, status_code=refusal[0])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, headers: Headers, method: str) -> tuple[int, str] | None:
        host = headers.get("host", "")
        if _hostname(host) not in self.names:
            return 403, (f"Host {host!r} is not a name this page is served at ({', '.join(sorted(self.names))}); "
                         "open it at the address the server printed, or start it with --allow-host NAME")
        if method not in WRITE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None:
            parts = urlsplit(origin) if origin != "null" else None
            if parts is None or parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
                return 403, (f"Origin {origin!r} is another site than this page ({host}); only the page itself may "
                             "send requests here")
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            return 415, f"Content-Type {media_type or 'none'!r}: expected application/json"
        return None
