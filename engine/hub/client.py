"""The HTTP client ``huggingface_hub`` uses for Branchwise's hub calls (``catalog.search``,
``catalog.repo_files``): every request has a time limit, and no request, redirects
included, goes to a host other than the hub's.

``huggingface_hub`` shares one ``httpx2.Client`` made by a factory (``set_client_factory``);
its default has no timeout (``timeout=None``), so a hub that accepts the connection and never
answers made ``branchwise models search`` wait forever. :func:`install` sets a factory whose
client:

* waits at most ``timeout_s`` for each connect, read and write (also when a call passes
  ``timeout=None``, as ``list_models`` does), and turns a timeout into
  :class:`HubTimeout` at once (``huggingface_hub`` retries its own timeout errors five times
  with back-off, which would make "20 s" about two minutes);
* follows redirects only to the endpoint's own origin (scheme, host, port) or to Hugging
  Face's hosts over https (``huggingface.co``, ``hf.co`` and their subdomains: the CDN and
  storage hosts); any other target raises :class:`RedirectRefused` before it is contacted;
* honours ``HF_HUB_OFFLINE`` as ``huggingface_hub``'s own client does.

This module imports neither Qt nor the rest of the engine; it contacts nothing by itself.
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

HUB_HOST_SUFFIXES = ("huggingface.co", "hf.co")
"""Hosts (and their subdomains) a redirect may go to over https besides the endpoint's."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
_lock = threading.Lock()
_installed: tuple[str, float] | None = None


class HubTimeout(Exception):
    """The hub accepted (or was being connected to) but sent nothing within ``timeout_s``."""

    def __init__(self, url: str, timeout_s: float):
        super().__init__(f"{url} did not answer within {timeout_s:g} s")
        self.url, self.timeout_s = url, timeout_s


class RedirectRefused(Exception):
    """A request (a redirect's target) would go to ``target_host``, which is neither the
    endpoint's origin nor a Hugging Face host."""

    def __init__(self, target_host: str):
        super().__init__(f"a redirect to {target_host} was not followed")
        self.target_host = target_host


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme, 0)


def allowed_url(url: str, endpoint: str) -> bool:
    """Whether a request to ``url`` may be sent for the hub at ``endpoint`` (both absolute
    URLs): the same origin as ``endpoint``, or https to a Hugging Face host (``HUB_HOST_SUFFIXES``)."""
    scheme, host, _ = _origin(url)
    if _origin(url) == _origin(endpoint):
        return True
    return scheme == "https" and any(host == s or host.endswith("." + s) for s in HUB_HOST_SUFFIXES)


def make_client(endpoint: str, timeout_s: float):
    """A new ``httpx2.Client`` for the hub at ``endpoint`` with the limits of the module
    docstring (``timeout_s``: seconds for each connect, read and write)."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    def guard(request) -> None:
        if constants.is_offline_mode():
            raise OfflineModeIsEnabled(f"Cannot reach {request.url}: offline mode is enabled (HF_HUB_OFFLINE).")
        if not allowed_url(str(request.url), endpoint):
            raise RedirectRefused(request.url.host)

    class TimedStream(httpx2.SyncByteStream):
        def __init__(self, inner, url: str):
            self.inner, self.url = inner, url

        def __iter__(self):
            try:
                yield from self.inner
            except httpx2.TimeoutException as exc:
                raise HubTimeout(self.url, timeout_s) from exc

        def close(self) -> None:
            self.inner.close()

    class TimedTransport(httpx2.HTTPTransport):
        def handle_request(self, request):
            # huggingface_hub passes timeout=None per request (it overrides the client's):
            # each phase is capped here, where every request passes.
            given = request.extensions.get("timeout") or {}
            request.extensions["timeout"] = {k: timeout_s if given.get(k) is None else min(given[k], timeout_s)
                                             for k in ("connect", "read", "write", "pool")}
            try:
                response = super().handle_request(request)
            except httpx2.TimeoutException as exc:
                raise HubTimeout(str(request.url), timeout_s) from exc
            response.stream = TimedStream(response.stream, str(request.url))
            return response

    return httpx2.Client(transport=TimedTransport(), timeout=httpx2.Timeout(timeout_s), follow_redirects=True,
                         event_hooks={"request": [guard]})


def install(endpoint: str, timeout_s: float) -> None:
    """Make ``huggingface_hub`` use :func:`make_client` for ``endpoint`` (its shared client is
    replaced only when ``endpoint`` or ``timeout_s`` changed since the last call)."""
    global _installed
    from huggingface_hub import set_client_factory

    with _lock:
        if _installed == (endpoint, timeout_s):
            return
        set_client_factory(lambda: make_client(endpoint, timeout_s))
        _installed = (endpoint, timeout_s)
