"""The meshscope dashboard (docs/dashboard.md).

``runs`` finds the runs a server may serve; ``data`` reads a run's written report; ``state``
is a view as its URL holds it; ``pages/`` builds each page's ``sections`` from the report;
``app`` is the Dash app that renders them; ``server`` serves it (waitress, the path guard);
``jobs`` analyses runs on first open; ``static_report`` writes the same pages as one HTML file.
"""
