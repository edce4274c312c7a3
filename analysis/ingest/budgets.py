"""How much one rank's trace may cost to read: each budget is enforced while the file is read,
not after, and a trace past one is refused with a line naming the file, what it exceeded and
the flag that raises it (the other ranks are analysed).

| budget | default | flag of ``meshscope analyze`` |
|---|---|---|
| ``trace_bytes``: JSON text a trace inflates to | 8 GiB | ``--max-trace-bytes`` |
| ``events``: events in one trace | 20,000,000 | ``--max-events`` |
| ``event_bytes``: text of one event (so of any string in it) and of the metadata | 64 MiB | ``--max-event-bytes`` |
| ``rank_memory``: a rank's event table while it is built, or a trace that cannot be streamed held whole | 8 GiB | ``--max-rank-memory`` |
| ``nesting``: levels of arrays and objects, anywhere in the trace | 64 | ``--max-nesting`` |

Nesting is checked on the text as it is inflated (``json_nesting.Nesting``), before it is
decoded. Raised past the JSON decoder's own limit (about 1,000 levels), a deeper event is
dropped and counted (``decode.py``) instead.

The defaults cover real traces (a rank of 100k–5M events, a few GB of JSON). The budgets travel
to the ingest worker processes as environment variables (``ENV``), which the command sets.
"""
from __future__ import annotations

import dataclasses
import os
import re

DEFAULTS = {"trace_bytes": 8 << 30, "events": 20_000_000, "event_bytes": 64 << 20,
            "rank_memory": 8 << 30, "nesting": 64}
FLAGS = {"trace_bytes": "--max-trace-bytes", "events": "--max-events",
         "event_bytes": "--max-event-bytes", "rank_memory": "--max-rank-memory",
         "nesting": "--max-nesting"}
#: Each budget's flag help (``meshscope analyze`` and ``compare`` list them).
HELP = {
    "trace_bytes": "Budget: JSON text one trace may inflate to (default 8GiB); a trace past "
                   "any budget is refused while it is read, the other ranks analysed.",
    "events": "Budget: events in one trace (default 20,000,000).",
    "event_bytes": "Budget: text of one event, so of any string in it (default 64MiB).",
    "rank_memory": "Budget: memory of one rank's event table, or of a trace that cannot be "
                   "streamed (default 8GiB).",
    "nesting": "Budget: levels of nested arrays and objects anywhere in one trace (default "
               "64; a Kineto event is about 5 deep).",
}
COUNTS = ("events", "nesting")      # budgets that are counts, not sizes
ENV = {k: "MESHSCOPE_MAX_" + k.upper() for k in DEFAULTS}
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10 ** 3, "kib": 1 << 10, "m": 1 << 20,
          "mb": 10 ** 6, "mib": 1 << 20, "g": 1 << 30, "gb": 10 ** 9, "gib": 1 << 30,
          "t": 1 << 40, "tb": 10 ** 12, "tib": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


@dataclasses.dataclass(frozen=True)
class Budgets:
    trace_bytes: int = DEFAULTS["trace_bytes"]
    events: int = DEFAULTS["events"]
    event_bytes: int = DEFAULTS["event_bytes"]
    rank_memory: int = DEFAULTS["rank_memory"]
    nesting: int = DEFAULTS["nesting"]


class BudgetExceeded(Exception):
    """A trace past one of its budgets; the message says what and which flag raises it."""

    def __init__(self, budget: str, what: str, limit: int):
        self.budget = budget
        shown = f"{limit:,}" if budget in COUNTS else human(limit)
        super().__init__(f"refused: {what} (budget {shown}; raise it with "
                         f"{FLAGS[budget]})")


def parse_size(text: str) -> int:
    """``8GiB``, ``512M``, ``100000`` → bytes (``ValueError`` otherwise)."""
    m = _SIZE.fullmatch(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 512MiB, 16GiB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            v = n / size
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} bytes"


def current() -> Budgets:
    """The budgets in force: the defaults, or what the environment (``ENV``) sets."""
    values = {}
    for k, var in ENV.items():
        text = os.environ.get(var)
        if text:
            try:
                values[k] = int(text)
            except ValueError:
                pass
    return Budgets(**values)


def non_default(limits: Budgets | None) -> dict[str, int] | None:
    """``limits`` as a dict when any differs from the defaults, else None: what a key (the
    report's, ``report/reuse.py``; a cached trace's, ``ingest/cache.py``) holds of the budgets,
    so that the defaults' keys never change."""
    if limits is None or limits == Budgets():
        return None
    return dataclasses.asdict(limits)


def environment() -> dict[str, str | None]:
    """This process' value of every budget variable (``ENV``; None: unset), as
    ``set_environment`` takes it: what a worker is handed to read under the same budgets, or
    what is restored after budgets were set for a while."""
    return {var: os.environ.get(var) for var in ENV.values()}


def set_environment(env: dict[str, str | None]) -> None:
    """Set the budget variables to ``env`` (``environment()``'s value); None unsets one."""
    for var, value in env.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def export(**values: int | None) -> None:
    """Set the budgets of this process and the workers it starts (None keeps the default)."""
    for k, v in values.items():
        if v is not None:
            os.environ[ENV[k]] = str(int(v))
