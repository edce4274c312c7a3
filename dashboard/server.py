"""Serving the dashboard: waitress (a production WSGI server) in front of the Dash app, on
loopback unless told otherwise, with a guard that answers only the addresses the app has.

``guard(app)`` wraps the WSGI app. A request reaches it only when its path — as sent
(``REQUEST_URI``) and as decoded (``PATH_INFO``) — is one of the app's own: ``/`` and the page
paths (``state.PAGES``), Dash's ``/_dash-…`` endpoints and component files, ``/assets/…``,
``/_favicon.ico``, and the two exports (``/export/html``, ``/export/perfetto``). Anything with
``..``, a backslash, a NUL, an encoded ``/`` or ``.`` or ``%`` left after decoding, or any
other path gets a bare ``404 not found``; methods other than GET, HEAD and POST get 405. Runs
themselves are named only by their id in the query string and looked up in the index
(``dashboard.runs``), so no request names a file.

Before the path, two checks a shared dashboard needs:

- **Host** (DNS rebinding): the ``Host`` header must name one of ``allowed_hosts`` (by default
  the loopback names ``localhost``, ``127.0.0.1``, ``::1``, and the address the server is bound
  to when that is a single one); any other gets ``400 host not allowed``. A web page of another
  site that rebinds its name to 127.0.0.1 sends its own name as ``Host`` and is refused.
  ``*`` allows any (behind a proxy that checks it).
- **Token**: with ``token`` set, every request must carry it, as ``Authorization: Bearer
  TOKEN`` or as the password of HTTP basic auth (any user name: a browser asks for it once);
  else ``401`` with a basic-auth challenge. Compared in constant time.

Errors never reach the browser as text: the Flask app answers any unhandled exception with
"internal error (details in the server log)" and logs the traceback
(``errors.install_error_page``, which the app installs itself).
"""
from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
import re
import signal
from urllib.parse import unquote

from .state import PAGES

log = logging.getLogger("meshscope.dashboard")

_ALLOWED = re.compile(r"^/(?:(?:%s)|_dash-[A-Za-z0-9_\-./@~]+|assets/[A-Za-z0-9_\-./]+|"
                      r"_favicon\.ico|export/(?:html|perfetto)|_reload-hash)?$"
                      % "|".join(PAGES))
_BAD = ("..", "\\", "\x00", "//")
_METHODS = {"GET", "HEAD", "POST"}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the dashboard on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind: str) -> tuple[str, ...]:
    """The loopback names, and ``bind`` itself when it is one address (not 0.0.0.0 / ::)."""
    extra = () if bind in ("0.0.0.0", "::", "") else (bind.strip("[]").lower(),)
    return tuple(dict.fromkeys(LOOPBACK_NAMES + extra))


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port: ``[::1]:8050`` → ``::1``."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_allowed(header: str | None, allowed) -> bool:
    if "*" in allowed:
        return True
    return bool(header) and host_name(header) in allowed


def token_ok(authorization: str | None, token: str) -> bool:
    """Whether the ``Authorization`` header carries ``token`` (bearer, or basic auth's
    password)."""
    if not authorization:
        return False
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value, validate=True).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
    elif scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.encode(), token.encode())


def path_allowed(raw_path: str, decoded_path: str) -> bool:
    """Whether a request for this path reaches the app (module docstring)."""
    raw = raw_path.split("?", 1)[0]
    if re.search(r"%(?:2[eEfF]|5[cC]|00|25)", raw):
        return False
    for p in (raw, decoded_path, unquote(raw)):
        if any(b in p for b in _BAD) or "%" in unquote(p):
            return False
    return bool(_ALLOWED.match(decoded_path)) and bool(_ALLOWED.match(unquote(raw)))


def _answer(start_response, status: str, text: str, extra=()):
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))),
                            ("X-Content-Type-Options", "nosniff"), *extra])
    return [body]


def guard(app, allowed_hosts=LOOPBACK_NAMES, token: str | None = None):
    allowed = {h.strip("[]").lower() for h in allowed_hosts}

    def guarded(environ, start_response):
        if not host_allowed(environ.get("HTTP_HOST"), allowed):
            log.info("refused Host %r", (environ.get("HTTP_HOST") or "")[:200])
            return _answer(start_response, "400 Bad Request", "host not allowed\n")
        if token and not token_ok(environ.get("HTTP_AUTHORIZATION"), token):
            return _answer(start_response, "401 Unauthorized", "token required\n",
                           [("WWW-Authenticate", 'Basic realm="meshscope", charset="UTF-8"')])
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "") or "/"
        raw = environ.get("REQUEST_URI") or environ.get("RAW_URI") or path
        if method not in _METHODS:
            return _answer(start_response, "405 Method Not Allowed", "method not allowed\n")
        if not path_allowed(raw, path):
            log.info("refused %s %r", method, raw[:200])
            return _answer(start_response, "404 Not Found", "not found\n")

        def start(status, headers, exc_info=None):
            headers = [h for h in headers if h[0].lower() != "server"]
            headers += [("X-Content-Type-Options", "nosniff"), ("X-Frame-Options", "DENY"),
                        ("Referrer-Policy", "no-referrer")]
            return start_response(status, headers, exc_info)
        return app(environ, start)
    return guarded


def serve(runs_dir, host: str = "127.0.0.1", port: int = 8050, threads: int = 4,
          allowed_hosts=None, token: str | None = None, limits=None,
          report_cache_bytes: int | None = None, page_timeout_s: float = 20.0) -> None:
    """Serve the dashboard over ``runs_dir`` until interrupted (Ctrl-C or SIGTERM); the
    analyses it started are killed when it stops (``dashboard.jobs``); ``report_cache_bytes``
    bounds the reports kept in memory (``dashboard.data.CACHE_BYTES``); ``page_timeout_s``:
    the longest a request waits for its page (``dashboard.page_builds``)."""
    import waitress

    from . import data
    from .app import create_app

    if report_cache_bytes is not None:
        data.CACHE_BYTES = report_cache_bytes

    app = create_app(runs_dir, limits=limits, page_timeout_s=page_timeout_s)
    hosts = tuple(allowed_hosts) if allowed_hosts else default_allowed_hosts(host)

    def stop(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        waitress.serve(guard(app.server, hosts, token), host=host, port=port,
                       threads=threads, ident="meshscope", clear_untrusted_proxy_headers=True)
    finally:
        app.server.config["MESHSCOPE_ANALYSES"].shutdown()
        app.server.config["MESHSCOPE_PAGE_BUILDS"].shutdown()
        signal.signal(signal.SIGTERM, previous)
