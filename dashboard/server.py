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

Errors never reach the browser as text: the Flask app answers any unhandled exception with
"internal error (details in the server log)" and logs the traceback (``install_error_page``).
"""
from __future__ import annotations

import logging
import re
from urllib.parse import unquote

from .state import PAGES

log = logging.getLogger("meshscope.dashboard")

_ALLOWED = re.compile(r"^/(?:(?:%s)|_dash-[A-Za-z0-9_\-./@~]+|assets/[A-Za-z0-9_\-./]+|"
                      r"_favicon\.ico|export/(?:html|perfetto)|_reload-hash)?$"
                      % "|".join(PAGES))
_BAD = ("..", "\\", "\x00", "//")
_METHODS = {"GET", "HEAD", "POST"}


def path_allowed(raw_path: str, decoded_path: str) -> bool:
    """Whether a request for this path reaches the app (module docstring)."""
    raw = raw_path.split("?", 1)[0]
    if re.search(r"%(?:2[eEfF]|5[cC]|00|25)", raw):
        return False
    for p in (raw, decoded_path, unquote(raw)):
        if any(b in p for b in _BAD) or "%" in unquote(p):
            return False
    return bool(_ALLOWED.match(decoded_path)) and bool(_ALLOWED.match(unquote(raw)))


def _answer(start_response, status: str, text: str):
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))),
                            ("X-Content-Type-Options", "nosniff")])
    return [body]


def guard(app):
    def guarded(environ, start_response):
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


def install_error_page(flask_app) -> None:
    """Unhandled exceptions: a short text for the browser, the traceback for the log."""
    from werkzeug.exceptions import HTTPException

    @flask_app.errorhandler(Exception)
    def _error(e):
        if isinstance(e, HTTPException):
            return f"{e.code} {e.name.lower()}\n", e.code, {"Content-Type": "text/plain"}
        log.exception("error while answering a request")
        return "internal error (details in the server log)\n", 500, \
            {"Content-Type": "text/plain"}


def serve(runs_dir, host: str = "127.0.0.1", port: int = 8050, threads: int = 4) -> None:
    """Serve the dashboard over ``runs_dir`` until interrupted."""
    import waitress

    from .app import create_app

    app = create_app(runs_dir)
    waitress.serve(guard(app.server), host=host, port=port, threads=threads,
                   ident="meshscope", clear_untrusted_proxy_headers=True)
