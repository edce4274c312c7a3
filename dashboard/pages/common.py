"""What the pages share: the context a page is built from, the labels of ranks and the
straggler, the colours every page uses for the same thing, and how a page of many ranks
draws them.

Many ranks (more than ``MANY_RANKS``): one bar or lane per rank is unreadable and slow to draw
(1,024 bars, labels skipping every other rank), so a page draws the distribution of the
per-rank value over every rank (``distribution_figure``: a histogram, each bin's ranks on
hover) and the ``TOP_K`` ranks that matter most for it (``top_ranks``: the largest values, and
the rank the URL focuses on), saying how many of how many it shows. The rank picker still
lists every rank, so any rank can be looked at.
"""
from __future__ import annotations

import dataclasses
import math

import plotly.graph_objects as go

from meshscope.analysis.report.model import trust_caveat_lines, trust_headline, trust_marks
from meshscope.vocabulary import EXPOSED_COMM_ORDER, TRUST_VERDICTS

from .. import sections as S
from ..data import RunReport
from ..sections import Note, missing
from ..state import ViewState

DIMS = EXPOSED_COMM_ORDER  # the breakdown's exposed-communication columns, in its order
COLOURS = {"compute": "#4C78A8", "compute without overlapped comm": "#4C78A8",
           "overlapped comm": "#72B7B2", "bubble": "#F2CF5B",
           "other": "#B279A2", "idle": "#BAB0AC", "wait": "#5E3C99",
           "forward": "#4C78A8", "backward": "#F58518", "weight-grad": "#54A24B",
           "exposed pp": "#E45756", "exposed tp": "#9D755D", "exposed cp": "#FF9DA6",
           "exposed ep": "#D67195", "exposed dp": "#B22222", "exposed unknown": "#79706E",
           "comm pp": "#E45756", "comm tp": "#9D755D", "comm cp": "#FF9DA6",
           "comm ep": "#D67195", "comm dp": "#B22222", "comm unknown": "#79706E",
           "comm": "#E45756", "transfer": "#E45756",
           # What-if savings: a saving of the named straggler in red; a saving with no
           # finding grey (no alarm colour without a finding); a negative saving blue.
           "saving straggler": "#D6604D", "saving": "#7F7F7F", "saving negative": "#4575B4"}
# "wait" (waiting for another rank) is purple on every page: never one of the "comm <dim>"
# colours, so transfer and waiting never read as the same thing.
# The template (plotly_white) is given as the figure leaves (``figure_theme``), not here: set in
# Python it costs a copy of the whole template per figure.
LAYOUT = {"margin": {"l": 70, "r": 20, "t": 40, "b": 50}}


@dataclasses.dataclass
class PageContext:
    report: RunReport
    state: ViewState

    @property
    def run_id(self) -> str:
        return self.report.run_id


def absent(ctx: PageContext, table: str, id_: str, what: str, why: str | None = None
           ) -> Note:
    """The note for what this report lacks (``sections.missing``), read from ``table``: a
    re-run where it would bring it — the report is older than this meshscope, or its
    ``table`` file is missing (a damaged or partial report) — else what the run's input lacks
    (``why``)."""
    written = ctx.report.has_table(table)
    return missing(id_, what, ctx.run_id,
                   schema_version=ctx.report.typed.schema_version if written else None,
                   why=why)


def evidence_section(report: RunReport) -> S.Section:
    """What the report's numbers rest on, as every page's header and the static report's top
    show it: the trust verdict and each failed check with the numbers it affects — the
    report's own words (``model.trust_headline``, ``trust_caveat_lines``), never re-derived here."""
    t = report.typed.trust
    head = S.Note("trust-verdict",
                  f"Evidence: {trust_headline(t, report.typed.schema_version)}",
                  warn=t is None or t.verdict != TRUST_VERDICTS[0])
    items = [head, *(S.Note(f"trust-caveat-{i}", line, warn=True)
                     for i, line in enumerate(trust_caveat_lines(t)))]
    if trust_marks(t):
        items.append(S.Note("trust-marks", "A rank marked † is usable with caveats, ‡ not "
                                           "trustworthy: its numbers rest on the checks above."))
    return S.Section(None, items, id="evidence")


def finding_title(f) -> str:
    """A finding's title as the pages show it: with the trust checks that failed on the
    numbers it rests on (``Finding.caveats``), where any did."""
    if not f.caveats:
        return f.title
    return f"{f.title} — rests on evidence that failed: {', '.join(f.caveats)}"


def pick_step(report: RunReport, step: int | None) -> int | None:
    """The step the URL names when the report has it, else the first profiled step."""
    steps = report.steps
    if step in steps:
        return step
    return steps[0] if steps else None


def rank_label(rank, report: RunReport) -> str:
    """``rank 3 (pp1·dp1)`` from run.json's mesh coordinates; ``rank 3`` without them; marked
    ``†`` (usable with caveats) or ``‡`` (not trustworthy) where the rank's evidence failed a
    check (``model.trust_marks``), so that its numbers carry the mark wherever a page shows
    them."""
    info = report.run_info
    label = info.rank_label(rank) if info is not None else f"rank {rank}"
    mark = _marks(report).get(rank)
    return f"{label} {mark}" if mark else label


_MARKS: dict[int, tuple[object, dict[int, str]]] = {}


def _marks(report: RunReport) -> dict[int, str]:
    """``trust_marks`` of the report's trust, made once per trust record: a page of 1,024
    ranks labels each (the stragglers page's heatmap: 0.1–0.2 s of its build made the same
    dictionary per label)."""
    trust = report.typed.trust
    held = _MARKS.get(id(trust))
    if held is None or held[0] is not trust:
        if len(_MARKS) > 64:
            _MARKS.clear()
        held = (trust, trust_marks(trust))
        _MARKS[id(trust)] = held
    return held[1]


def straggler_text(report: RunReport) -> str | None:
    """One line naming the straggler and what fixing it saves; None when there is none."""
    s = report.typed.straggler
    if s is None:
        return None
    text = f"Straggler: rank {s.rank}"
    if s.saving_us is not None:
        text += f" — running it at its reference pace saves {s.saving_us / 1e3:.2f} ms " \
                f"per step"
        head = report.typed.step_time.us
        if head:
            text += f" ({100 * s.saving_us / head:.1f}% of the {head / 1e3:.2f} ms step)"
        if s.reference:
            text += f", against {s.reference}"
    elif s.wait_caused_us is not None:
        text += f" — the others waited {s.wait_caused_us / 1e3:.2f} ms for it"
        if s.last_share is not None:
            text += f"; last to arrive at {100 * s.last_share:.0f}% of its collectives"
    return text + "."


def lanes_layout(fig, title: str, xaxis_title: str, order: list[str], row_px: int) -> None:
    """The layout of a figure with one horizontal lane per rank, ``order`` top to bottom
    (the Gantt of the pipeline page, the timeline)."""
    fig.update_layout(**LAYOUT, barmode="overlay", height=150 + row_px * len(order),
                      title=title, xaxis_title=xaxis_title,
                      yaxis={"categoryorder": "array", "categoryarray": order[::-1]},
                      legend={"orientation": "h", "y": -0.22})


MANY_RANKS = 48     # above this, pages draw distributions and the top ranks (module docstring)
TOP_K = 16


def many_ranks(report: RunReport) -> bool:
    return len(report.ranks) > MANY_RANKS


def top_ranks(values: dict[int, float | None], k: int = TOP_K, focus: int | None = None
              ) -> list[int]:
    """The ``k`` ranks with the largest values (ties: the lower rank), and ``focus`` when it
    has a value, in rank order."""
    known = {r: v for r, v in values.items() if v is not None and not math.isnan(v)}
    chosen = sorted(known, key=lambda r: (-known[r], r))[:k]
    if focus is not None and focus in values and focus not in chosen:
        chosen.append(focus)
    return sorted(chosen)


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``0–2, 5, 7–8``."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])  # type: ignore[arg-type]
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in out)  # type: ignore[misc]


def distribution_figure(values_ms: dict[int, float | None], title: str, xaxis_title: str,
                        bins: int = 40) -> go.Figure:
    """The distribution of a per-rank value (ms) over every rank: a histogram whose bars say,
    on hover, their range, how many ranks and which (``0–15, 17``)."""
    known = {r: v for r, v in values_ms.items() if v is not None and not math.isnan(v)}
    fig = go.Figure()
    if known:
        lo, hi = min(known.values()), max(known.values())
        width = (hi - lo) / bins if hi > lo else 1.0
        edges = [lo + i * width for i in range(bins + 1)]
        members: list[list[int]] = [[] for _ in range(bins)]
        for r, v in known.items():
            members[min(int((v - lo) / width), bins - 1) if hi > lo else 0].append(r)
        keep = [i for i in range(bins) if members[i]]
        fig.add_bar(x=[round((edges[i] + edges[i + 1]) / 2, 4) for i in keep],
                    y=[len(members[i]) for i in keep], width=width * 0.95,
                    marker_color="#4C78A8", name="ranks",
                    customdata=[[round(edges[i], 3), round(edges[i + 1], 3),
                                 rank_ranges(members[i])[:160]] for i in keep],
                    hovertemplate="%{customdata[0]}–%{customdata[1]} ms: %{y} ranks"
                                  "<br>ranks %{customdata[2]}<extra></extra>")
    fig.update_layout(**LAYOUT, height=300, title=title, xaxis_title=xaxis_title,
                      yaxis_title="ranks", bargap=0, showlegend=False)
    return fig
