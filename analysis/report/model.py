"""The report's records that its writers and readers share, each defined once.

A finding is made by the analysers (``findings.py``, ``device_findings.py``,
``memory_findings.py``), written into summary.json by ``summary.py`` (``Finding.to_dict``) and
read back by every reader — the CLI text, ``--json``, compare, the static report, the dashboard
— through ``reader.read_summary`` (``Finding.read``): one class, so a field cannot mean one
thing where it is made and another where it is shown. Its ``id`` is a ``vocabulary.FindingId``:
an analyser cannot make a finding of an id the vocabulary does not hold (``ValueError``); a
report written by another version that holds one is still read (the id kept as its string).

============== ============================================================================
field          meaning
============== ============================================================================
id             ``FindingId`` (its string in summary.json)
severity       ``high`` (≥ 10% of the step), ``medium`` (≥ 3%) or ``low``
dimension      the communication dimension it concerns, ``all``, or None
cost_us        the what-if saving per step (µs); None for hangs, desyncs and memory
cost_pct       cost_us over the report's headline step time × 100
title          one line
evidence       the numbers and the ranks, group, step behind it
remedy         what to change
what_if        ``step_time_us`` after the remedy and the ``assumption`` it rests on
symptoms       other observations this finding explains (the waits of the straggler's peers)
peak_saving_   memory findings: by how much the remedy lowers the memory peak (bytes)
bytes
============== ============================================================================
"""
from __future__ import annotations

import dataclasses
from typing import Any

from meshscope.vocabulary import FINDING_IDS, FindingId


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x \
        else None


@dataclasses.dataclass
class Finding:
    """One finding (module docstring, field by field)."""
    id: FindingId | str
    severity: str
    dimension: str | None
    cost_us: float | None
    cost_pct: float | None
    title: str
    evidence: dict[str, Any]
    remedy: str
    what_if: dict[str, Any] = dataclasses.field(default_factory=dict)
    symptoms: list[Any] = dataclasses.field(default_factory=list)
    peak_saving_bytes: float | None = None

    def __post_init__(self) -> None:
        self.id = FindingId(self.id)          # ValueError for an id the vocabulary lacks

    def to_dict(self) -> dict[str, Any]:
        """The finding as summary.json holds it (the id as its string)."""
        return dataclasses.asdict(self) | {"id": str(self.id)}

    @classmethod
    def read(cls, d: Any) -> Finding | None:
        """A finding of a summary.json document, every field typed (None for an entry that is
        not a finding: not an object, no string id). An id this version does not know — a
        newer report's — is kept as its string."""
        if not isinstance(d, dict) or not isinstance(d.get("id"), str):
            return None
        fields = dict(
            severity=str(d.get("severity") or ""),
            dimension=d["dimension"] if isinstance(d.get("dimension"), str) else None,
            cost_us=_num(d.get("cost_us")), cost_pct=_num(d.get("cost_pct")),
            title=str(d.get("title") or d["id"]),
            evidence=d["evidence"] if isinstance(d.get("evidence"), dict) else {},
            remedy=str(d.get("remedy") or ""),
            what_if=d["what_if"] if isinstance(d.get("what_if"), dict) else {},
            symptoms=d["symptoms"] if isinstance(d.get("symptoms"), list) else [],
            peak_saving_bytes=_num(d.get("peak_saving_bytes")))
        if d["id"] in FINDING_IDS:
            return cls(id=d["id"], **fields)
        found = object.__new__(cls)
        for name, value in {"id": d["id"], **fields}.items():
            object.__setattr__(found, name, value)
        return found
