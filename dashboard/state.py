"""The state of a view, as its URL holds it — so that every view has an address to share.

``/PAGE?run=ID[&run=ID2…][&rank=R][&step=S][&color=METRIC]``: the page is the path
(``/overview``, ``/gpu``, ``/memory``, ``/pipeline``…; ``/`` is the runs list), ``run`` names the run by its id (the
compare page takes it several times, or ``sweep=ID`` for a whole sweep folder), ``rank`` and
``step`` select what the page zooms on, ``color`` what the mesh is coloured by, ``quantity``
what the history page draws (``/history``). ``parse`` reads
any query string without failing: a value that is not what it should be is dropped (and the
fields after the first ``MAX_FIELDS``), and the page then falls back to its default (the first
profiled step, no rank).
"""
from __future__ import annotations

import dataclasses
import re
from urllib.parse import parse_qs, urlencode

PAGES = ("overview", "gpu", "memory", "pipeline", "communication", "stragglers", "timeline",
         "health", "compare", "history")
TITLES = {"runs": "Runs", "overview": "Overview", "gpu": "GPU", "memory": "Memory",
          "pipeline": "Pipeline", "communication": "Communication", "stragglers": "Stragglers",
          "timeline": "Timeline", "health": "Health", "compare": "Compare",
          "history": "History"}
MAX_RUNS = 16          # runs one compare view takes
MAX_FIELDS = 64        # query fields read; the rest of a longer query string is ignored
MAX_INT = 1 << 31
_QUANTITY = re.compile(r"[a-z_]+(?:\.[a-z_/]+){0,2}")


@dataclasses.dataclass(frozen=True)
class ViewState:
    page: str = "runs"
    runs: tuple[str, ...] = ()
    sweep: str | None = None
    rank: int | None = None
    step: int | None = None
    color: str | None = None
    quantity: str | None = None      # the history page's quantity (compare's names)
    # True when the page is rendered into the static HTML report (no server behind it: no
    # instruction to click, no link); never part of a URL.
    static: bool = dataclasses.field(default=False, compare=False)

    @property
    def run(self) -> str | None:
        return self.runs[0] if self.runs else None

    def query(self, **change) -> str:
        """The query string of this state with ``change`` applied (None removes a key)."""
        s = dataclasses.replace(self, **change)
        pairs: list[tuple[str, object]] = [("run", r) for r in s.runs]
        for key in ("sweep", "rank", "step", "color", "quantity"):
            v = getattr(s, key)
            if v is not None:
                pairs.append((key, v))
        return ("?" + urlencode(pairs)) if pairs else ""

    def href(self, page: str | None = None, **change) -> str:
        page = page or self.page
        return ("/" if page == "runs" else f"/{page}") + self.query(**change)


def _int(values: list[str]) -> int | None:
    if not values:
        return None
    v = values[0].strip()
    if v.lstrip("-").isdigit() and len(v) < 12 and abs(int(v)) < MAX_INT:
        return int(v)
    return None


def parse(pathname: str | None, search: str | None) -> ViewState:
    path = (pathname or "/").strip("/")
    page = path if path in PAGES else "runs"
    q = parse_qs("&".join((search or "").lstrip("?").split("&")[:MAX_FIELDS]),
                 keep_blank_values=False, max_num_fields=MAX_FIELDS)
    runs = tuple(dict.fromkeys(r for r in q.get("run", []) if r and len(r) < 512))[:MAX_RUNS]
    sweep = (q.get("sweep") or [None])[0]
    color = (q.get("color") or [None])[0]
    quantity = (q.get("quantity") or [None])[0]
    return ViewState(page=page, runs=runs, sweep=sweep if sweep and len(sweep) < 512 else None,
                     rank=_int(q.get("rank", [])), step=_int(q.get("step", [])),
                     color=color if color and len(color) < 32 else None,
                     quantity=quantity if quantity and len(quantity) < 64
                     and _QUANTITY.fullmatch(quantity) else None)
