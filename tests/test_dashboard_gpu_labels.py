"""The GPU page says which quantity a bar is when two differ (issue 51 item 5): the TensorBoard
plugin's "Communication" category is labelled as a category, drawn in a colour and pattern no
exposed-communication bar uses, and where it differs from the breakdown's exposed
communication for that rank the page gives both numbers, each named by what it measures; where
they agree it says nothing. Hand-made report tables, answers known by construction."""
from __future__ import annotations

import json
import pathlib

import pandas as pd

from meshscope.dashboard.data import RunReport
from meshscope.dashboard.pages import device
from meshscope.dashboard.pages.common import COLOURS


# a summary.json to label ranks with (any of today's schema; its numbers are not read here)
SUMMARY = pathlib.Path(__file__).resolve().parents[1] / "samples" / "dp4-ddp" / "report" / \
    "summary.json"


def _report(category_us: float, exposed_us: float) -> RunReport:
    cats = pd.DataFrame([{"rank": 0, "step": 3, "window_us": 50_000.0, "kernel_us": 30_000.0,
                          "memcpy_us": 0.0, "memset_us": 0.0, "communication_us": category_us,
                          "runtime_us": 0.0, "dataloader_us": 0.0, "cpu_exec_us": 0.0,
                          "other_us": 0.0}])
    bd = pd.DataFrame([{"rank": 0, "step": 3, "window_us": 50_000.0,
                        "exposed_comm_us": exposed_us}])
    return RunReport(entry=None, summary=json.loads(SUMMARY.read_text()), tables={"step_categories": cats, "breakdown": bd},
                     written=frozenset({"step_categories", "breakdown"}), run_info=None,
                     mtime_ns=0)  # type: ignore[arg-type]


def test_a_category_that_differs_from_exposed_communication_is_said_with_both_numbers():
    note = device.category_note(_report(10_910.0, 12_220.0), 0)
    assert note is not None and note.id == "categories-vs-exposed"
    assert "Communication (category)" in note.text and "10.91 ms in step 3" in note.text
    assert "exposed communication" in note.text and "12.22 ms in that step" in note.text


def test_no_note_where_the_two_agree():
    assert device.category_note(_report(12_220.0, 12_220.0), 0) is None
    assert device.category_note(_report(12_220.0, 12_220.5), 0) is None     # under 1 µs


def test_the_category_bar_is_named_a_category_and_never_drawn_as_exposed_communication():
    fig = device.categories_figure(_report(10_910.0, 12_220.0), 0)
    bar = next(t for t in fig.data if "Communication" in t.name)
    assert bar.name == "Communication (category)"
    assert bar.marker.color not in {v for k, v in COLOURS.items()
                                    if k.startswith(("exposed", "comm"))}
    assert bar.marker.pattern.shape == "/"
