"""Cross-site requests to ``branchwise serve`` are refused (issue 30, item 8).

A web page in the user's browser can post to ``http://127.0.0.1:8080`` (cross-site
request forgery), and a page whose host name the attacker re-points at 127.0.0.1 can even
read the answers (DNS rebinding). Both are stopped here, before the routes and the API
key check, with a 403 and an OpenAI error object:

* **Host**: the ``Host`` header must name the address the server listens on. Bound to a
  loopback address that is ``localhost``, ``127.0.0.1`` or ``[::1]``; bound to another
  address, that address (or, for ``0.0.0.0``/``::``, any IP literal). A port in the
  header must be the server's. ``--allowed-host NAME`` (repeatable) adds host names, for
  a reverse proxy or a name in ``/etc/hosts``.
* **Origin**: a request with an ``Origin`` header (browsers send one on cross-site
  requests) is refused unless that origin was configured with ``--allowed-origin``
  (repeatable, e.g. ``http://localhost:3000``). Tools such as the ``openai`` client or
  ``curl`` send none.
* **Content type**: a ``POST`` body must be ``application/json``: a page can send
  ``text/plain`` or a form without a CORS pre-flight, but not JSON.

CORS pre-flights (``OPTIONS``) are answered for the configured origins only, by
Starlette's ``CORSMiddleware``; without any configured origin there is no CORS at all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from app.serve import protocol

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _split_host(value: str) -> tuple[str, int | None]:
    """``"127.0.0.1:8080"`` -> ("127.0.0.1", 8080); ``"[::1]:80"`` -> ("::1", 80). A port
    that is not a number gives -1 (never a match)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif value.count(":") == 1:
        name, port = value.split(":")
    else:
        name, port = value, None
    if port is None or port == "":
        return name.rstrip("."), None
    return name.rstrip("."), int(port) if port.isdigit() else -1


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class CrossSiteGuard:
    """ASGI middleware refusing cross-site requests with 403 (see the module notes).

    Args:
        app: the ASGI app behind it.
        bind_host: the address the server listens on (``127.0.0.1``, ``::1``, ``0.0.0.0``...).
        port: a callable giving the port listened on (known only once bound, for port 0).
        allowed_hosts: extra host names accepted in ``Host``.
        allowed_origins: origins accepted in ``Origin`` (``scheme://host[:port]``); they
            also get CORS pre-flight answers.
    """

    def __init__(self, app, bind_host: str, port, allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = ()):
        self.origins = [o.strip().rstrip("/").lower() for o in allowed_origins if o.strip()]
        self.app = CORSMiddleware(app, allow_origins=self.origins, allow_methods=["GET", "POST"],
                                  allow_headers=["authorization", "content-type"]) if self.origins else app
        bind = bind_host.strip("[]").lower()
        self.any_ip = bind in ("0.0.0.0", "::", "")
        names = {bind, *(_split_host(h)[0] for h in allowed_hosts if h.strip())}
        if bind == "localhost" or (_is_ip(bind) and ipaddress.ip_address(bind).is_loopback):
            names.update(LOOPBACK_NAMES)
        self.names = names
        self.port = port

    def refusal(self, scope) -> str | None:
        """Why the request in ``scope`` is refused, or None to let it through."""
        headers = {}
        for k, v in scope.get("headers") or []:
            headers.setdefault(k.lower(), v.decode("latin-1"))
        name, port = _split_host(headers.get(b"host", ""))
        if not (name in self.names or (self.any_ip and _is_ip(name))) or port not in (None, self.port()):
            return (f"The Host header {headers.get(b'host', '(none)')!r} is not an address this server "
                    "listens on; start it with --allowed-host NAME to accept that name.")
        origin = headers.get(b"origin")
        if origin is not None and origin.strip().rstrip("/").lower() not in self.origins:
            return (f"The Origin header {origin!r} names a web page, and web pages may not use this "
                    "server; start it with --allowed-origin ORIGIN to accept that origin.")
        if scope.get("method") == "POST":
            media = headers.get(b"content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return "The request body must be JSON, sent with 'Content-Type: application/json'."
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            why = self.refusal(scope)
            if why is not None:
                response = JSONResponse(protocol.error_body(why, code="cross_site_refused"), status_code=403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
