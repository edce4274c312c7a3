"""What the dashboard answers for an error no page handled: a short text for the browser and
the traceback for the server's log — never a traceback or a server path in a page. The app
installs it on its Flask server (``app.create_app``); ``server.serve`` runs that app."""
from __future__ import annotations

import logging

log = logging.getLogger("meshscope.dashboard")


def install_error_page(flask_app) -> None:
    """Unhandled exceptions: a short text for the browser, the traceback for the log; a
    request for a script Dash does not serve is a 404, logged as nothing."""
    from werkzeug.exceptions import HTTPException

    from dash.exceptions import DependencyException

    @flask_app.errorhandler(Exception)
    def _error(e):
        if isinstance(e, HTTPException):
            return f"{e.code} {e.name.lower()}\n", e.code, {"Content-Type": "text/plain"}
        if isinstance(e, DependencyException):
            # A script path Dash does not serve (``/_dash-component-suites/dash/nope.js``):
            # the request's mistake, not the server's — no traceback in the log.
            return "not found\n", 404, {"Content-Type": "text/plain"}
        log.exception("error while answering a request")
        return "internal error (details in the server log)\n", 500, \
            {"Content-Type": "text/plain"}
