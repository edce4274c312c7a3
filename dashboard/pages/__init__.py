"""One module per dashboard page. Each has ``sections(ctx) -> list[Section]`` (what the page
shows, ``dashboard.sections``), built on the server from the run's written report; the Dash
app and the static HTML report both render those sections.
"""
