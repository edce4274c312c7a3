"""The static HTML report: one self-contained file with a run's pages — overview, GPU (for a
run with GPU activity), memory (for a run recorded with memory events or a snapshot), pipeline, communication, stragglers, timeline (where the report has its
aligned timeline table), health —
to attach to a review; the pipeline and timeline pages once per profiled step, and no
instruction that needs the server (no "click", no links). Plotly's JavaScript is embedded once, so the figures stay interactive
(hover, zoom) with no server and no network; nothing is loaded from anywhere.

The pages are the dashboard's own (``dashboard.pages``, rendered by ``sections.to_html``), so
the file shows the same numbers as the dashboard for the same report. ``write_html(entry, out)``
is what ``meshscope report RUN --html out.html`` calls. Its top says what the numbers rest on
(the trust verdict and its caveats, ``pages.common.evidence_section``), as every dashboard
page's header does.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import pathlib

from . import sections as S
from .data import RunReport, open_report
from .pages import communication, device, health, memory, overview, pipeline, stragglers, \
    timeline
from .pages.common import PageContext, evidence_section
from .runs import RunEntry
from .state import TITLES, ViewState

# Pages drawn once per profiled step: the static report carries every step, not only the first.
PER_STEP = ("pipeline", "timeline")

PAGES = (("overview", overview.sections), ("gpu", device.sections),
         ("memory", memory.sections), ("pipeline", pipeline.sections),
         ("communication", communication.sections), ("stragglers", stragglers.sections),
         ("timeline", timeline.sections), ("health", health.sections))

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1200px;margin:0 auto;
padding:8px 24px 40px;color:#222}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 0}
nav a{margin-right:16px;color:#1f5fa8;text-decoration:none}
h2{margin-top:28px;border-bottom:1px solid #eee}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:4px 0}
th,td{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right;vertical-align:top}
th{border-bottom:2px solid #888} .l{text-align:left} .hi{background:#fde8e8}
.note{color:#555;font-style:italic} .warn{background:#fff4e5;border:1px solid #f0b36a;
border-radius:4px;padding:8px 12px} .facts span{margin-right:18px} .table{overflow-x:auto}
"""


def render_html(report: RunReport) -> str:
    """The whole report as one HTML document."""
    import plotly.offline

    parts = []
    for page, build in PAGES:
        if page == "timeline" and not report.has_table("timeline"):
            continue  # without the report's own table the timeline needs the traces
        if page == "gpu" and not device.is_gpu(report):
            continue  # a CPU run has no GPU figures
        if page == "memory" and not memory.has_memory(report):
            continue  # recorded without memory events and no snapshot
        ctx = PageContext(report, ViewState(page=page, runs=(report.run_id,), static=True))
        body = S.to_html(build(ctx))
        if page in PER_STEP:
            for step in report.steps[1:]:
                ctx = PageContext(report, ViewState(page=page, runs=(report.run_id,),
                                                    step=step, static=True))
                body += S.to_html(_step_sections(build(ctx), step))
        parts.append(f'<h2 id="page-{page}">{TITLES[page]}</h2>'
                     f'<div class="page" id="{page}">{body}</div>')
    nav = "".join(f'<a href="#page-{p}">{TITLES[p]}</a>' for p, _ in PAGES
                  if f'id="page-{p}"' in "".join(parts))
    title = html.escape(f"meshscope report · {report.run_id}")
    made = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{title}</title><style>{CSS}</style>"
            f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
            f"<h1>{title}</h1><p class=\"note\">Written {made} from the report of "
            f"{html.escape(report.typed.generated or '?')} (meshscope "
            f"summary schema {report.schema_version}).</p>"
            f"{S.to_html([evidence_section(report)])}<nav>{nav}</nav>"
            + "\n".join(parts) + "</body></html>")


def _step_sections(sections: list, step: int) -> list:
    """The sections of a page that are about ``step`` (their title names it), their items'
    ids suffixed so that the figures of every step stay apart in one document."""
    out = []
    for sec in sections:
        if sec.title and f"step {step}" in sec.title.lower():
            items = [dataclasses.replace(i, id=f"{i.id}-step{step}")
                     if getattr(i, "id", None) else i for i in sec.items]
            out.append(dataclasses.replace(sec, items=items))
    return out


def write_html(entry: RunEntry, out: pathlib.Path) -> pathlib.Path:
    """Write ``entry``'s static report to ``out``; ReportUnreadable when its report cannot be
    read."""
    out = pathlib.Path(out)
    text = render_html(open_report(entry))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out
