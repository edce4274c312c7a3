"""What the dashboard answers for an error no page handled: a short text for the browser and
the traceback for the server's log — never a traceback or a server path in a page. The app
installs it on its Flask server (``app.create_app``); ``server.serve`` runs that app."""
from __future__ import annotations

import logging

log = logging.getLogger("meshscope.dashboard")


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
