"""summary.json declared once (issue 44): the typed record the analysis builds, its one codec,
the JSON Schema generated from it, and the reader of every earlier version.

- the shipped schema (package data and docs/) is what the record generates, and
  ``meshscope schema summary`` prints it;
- every record in it is closed and every field required; a row of a report table carries the
  table's registered columns;
- the codec on small hand-made records whose answer is known by construction (encode, decode
  in both modes, the schema);
- every earlier schema version still reads (``tests/data/summaries``); a version bump without
  a document of the version before it fails here;
- the samples validate, and reading a summary imports neither pandas nor jsonschema. (Every
  summary.json any test writes is validated too: ``conftest.every_written_summary_validates``.)
"""
from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import subprocess
import sys
from typing import Any

import jsonschema
import pytest

from conftest import ROOT, meshscope
from meshscope.analysis.report import codec, model, reader, summary_schema, tables
from meshscope.analysis.report.model import REPORT_SCHEMA_VERSION, Summary

DATA = pathlib.Path(__file__).parent / "data" / "summaries"
SAMPLES = ROOT / "samples"


def test_the_shipped_schema_is_the_one_the_record_generates():
    generated = summary_schema.text()
    assert summary_schema.SHIPPED.read_text() == generated, "stale: run `make schema`"
    assert (ROOT / "docs" / "summary.schema.json").read_text() == generated, "`make schema`"
    proc = meshscope("schema", "summary")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == summary_schema.schema()
    jsonschema.Draft202012Validator.check_schema(summary_schema.schema())


def test_every_record_is_closed_and_every_field_required():
    defs = summary_schema.schema()["$defs"]
    assert {"Summary", "Finding", "CrossRank", "RankMean", "MemorySnapshot", "Oom"} <= set(defs)
    for name, d in defs.items():
        assert d["additionalProperties"] is False, name
        assert d["required"] == list(d["properties"]), name
    # maps keyed by data carry their values' schema
    assert defs["Summary"]["properties"]["table_clocks"] == \
        {"type": "object", "additionalProperties": {"type": "string"}}
    assert defs["ReplayedImbalance"]["properties"]["stage_work_us"] == \
        {"type": "object", "additionalProperties": {"type": "number"}}
    assert defs["RunFacts"]["properties"]["layout"]["additionalProperties"] == \
        {"type": "integer"}


@pytest.mark.parametrize("record, table, left_out", [
    (model.RankMean, "breakdown", {"step"}), (model.GpuIdle, "idle", {"step", "idle_us"}),
    (model.TopKernel, "kernels", set()), (model.Hang, "flight_recorder", set()),
    (model.BandwidthRow, "bandwidth_summary", set()), (model.ClockOffset, "clock_offsets", set()),
    (model.MemoryDevice, "memory_devices", set()), (model.TraceOverlap, "trace_overlap", set())])
def test_a_table_row_carries_the_tables_registered_columns(record, table, left_out):
    assert [f.name for f in dataclasses.fields(record)] == \
        [c for c in tables.COLUMNS[table] if c not in left_out]


# -- the codec on hand-made records --------------------------------------------------------

class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Point:
    """A point."""
    x: float
    label: str | None


@dataclasses.dataclass(frozen=True)
class Shape:
    """A shape of points."""
    colour: Colour
    points: list[Point]
    tags: dict[str, int]
    extra: Any
    count: int = 0


def test_the_codec_round_trips_a_record_as_declared():
    shape = Shape(Colour.BLUE, [Point(1, None), Point(2.5, "b")], {"a": 3}, {"k": [1]}, 7)
    doc = codec.encode(shape)
    assert json.dumps(doc) == ('{"colour": "blue", "points": [{"x": 1, "label": null}, '
                               '{"x": 2.5, "label": "b"}], "tags": {"a": 3}, '
                               '"extra": {"k": [1]}, "count": 7}')
    assert codec.decode(Shape, doc, strict=True) == shape
    # an integer a float field holds is written back as it was read
    assert codec.encode(codec.decode(Point, {"x": 4, "label": None}))["x"] == 4
    # an integral float in an integer field is read as the integer
    assert codec.decode(Shape, {**doc, "count": 7.0}).count == 7


@pytest.mark.parametrize("doc, place", [
    ({"colour": "blue", "points": [{"x": "1", "label": None}], "tags": {}, "extra": 0},
     "$.points[0].x: expected a number, got str"),
    ({"colour": "blue", "points": [], "tags": {"a": 1.5}, "extra": 0},
     "$.tags.a: expected an integer, got float"),
    ({"colour": "blue", "points": {}, "tags": {}, "extra": 0},
     "$.points: expected a list, got dict"),
    ({"colour": "blue", "points": [], "tags": {}, "extra": 0, "count": True},
     "$.count: expected an integer, got bool"),
    ({"colour": "blue", "points": [7], "tags": {}, "extra": 0},
     "$.points[0]: expected an object (Point), got int"),
])
def test_a_value_of_the_wrong_type_is_named_by_its_place(doc, place):
    with pytest.raises(codec.CodecError) as e:
        codec.decode(Shape, doc)
    assert str(e.value) == place


def test_strict_decoding_refuses_what_the_record_does_not_declare():
    doc = {"colour": "red", "points": [], "tags": {}, "extra": None, "radius": 2}
    with pytest.raises(codec.CodecError, match=r"^\$: radius not a field of Shape$"):
        codec.decode(Shape, doc, strict=True)
    with pytest.raises(codec.CodecError, match=r"^\$\.points: missing$"):
        codec.decode(Shape, {"colour": "red", "tags": {}, "extra": None}, strict=True)
    with pytest.raises(codec.CodecError, match="'green' is not one of red, blue"):
        codec.decode(Shape, {"colour": "green", "points": [], "tags": {}, "extra": None},
                     strict=True)
    # reading (not strict): a newer report's key is ignored, a missing one is empty, an
    # unknown enum value kept as its text
    read = codec.decode(Shape, {"colour": "green", "tags": {}, "radius": 2})
    assert (read.colour, read.points, read.extra, read.count) == ("green", [], None, 0)


def test_the_schema_of_a_hand_made_record():
    assert codec.schema(Shape) == {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/Shape",
        "$defs": {
            "Point": {"type": "object", "description": "A point.",
                      "properties": {"x": {"type": "number"},
                                     "label": {"type": ["string", "null"]}},
                      "required": ["x", "label"], "additionalProperties": False},
            "Shape": {"type": "object", "description": "A shape of points.",
                      "properties": {"colour": {"enum": ["red", "blue"]},
                                     "points": {"type": "array",
                                                "items": {"$ref": "#/$defs/Point"}},
                                     "tags": {"type": "object",
                                              "additionalProperties": {"type": "integer"}},
                                     "extra": {}, "count": {"type": "integer"}},
                      "required": ["colour", "points", "tags", "extra", "count"],
                      "additionalProperties": False}}}


# -- every earlier version read ------------------------------------------------------------

def test_the_reader_reads_every_earlier_version():
    """A version bump fails here until a document of the version before it is kept in
    tests/data/summaries (its README)."""
    for version in range(1, REPORT_SCHEMA_VERSION):
        docs = sorted(DATA.glob(f"v{version}-*.json"))
        assert docs, f"no summary.json of schema {version} in {DATA}"
        for path in docs:
            doc = json.loads(path.read_text())
            assert doc["schema_version"] == version, path
            typed = reader.read_summary(doc)
            assert typed.schema_version == version
            assert typed.ranks == doc["ranks"] and typed.steps == doc["steps"]
            assert [str(f.id) for f in typed.findings] == [f["id"] for f in doc["findings"]]


def test_schema_1_heads_with_the_largest_window_and_its_hangs_are_the_verdict():
    typed = reader.read_summary(json.loads((DATA / "v1-two-ranks.json").read_text()))
    st = typed.step_time
    assert (st.us, st.source, st.timer_us, st.replayed_us, st.window_us) == \
        (1250.0, "window", None, None, 1250.0)
    assert typed.hangs_in_summary and typed.hangs == []
    assert typed.run is not None and typed.run.layout == {"dp": 2}
    assert typed.run_fact("world_size") == 2 and typed.run.device.name is None
    assert typed.per_rank_mean[1].idle_us == 200.0 and typed.per_rank_mean[1].bubble_us is None


def test_schema_2_names_its_step_times_and_imbalance_as_today():
    typed = reader.read_summary(json.loads((DATA / "v2-replayed.json").read_text()))
    st = typed.step_time
    assert (st.us, st.source, st.timer_us, st.replayed_us, st.window_us) == \
        (202836.3, "timer", 202836.3, 307829.0, 275166.0)
    assert typed.tokens_per_s == 5048.4
    assert typed.stage_imbalance_measured is None
    assert typed.stage_imbalance_without_straggler == model.ReplayedImbalance(
        10.0, 1.05, 0, {"0": 2.0, "1": 1.9})
    assert not typed.hangs_in_summary
    assert typed.straggler is not None and typed.straggler.rank == 1
    # the waits each rank caused, from the older rank_waits rows
    assert typed.cross_rank.wait_caused_of() == {1: 304547.0, 3: 12.0}
    assert typed.cross_rank.saving_of() == {1: 63140.0}


def test_schema_3_is_read_as_written_without_choosing_again():
    for path in sorted(DATA.glob("v3-*.json")):
        doc = json.loads(path.read_text())
        typed = reader.read_summary(doc)
        assert (typed.step_time_us, typed.step_time_source, typed.window_us) == \
            (doc["step_time_us"], doc["step_time_source"], doc["window_us"])
        assert [m.idle_us for m in typed.per_rank_mean] == \
            [m["idle_us"] for m in doc["per_rank_mean"]]
        assert [g.idle_queued_us for g in typed.gpu_idle_per_rank_mean] == \
            [g["idle_queued_us"] for g in doc["gpu_idle_per_rank_mean"]]
    # a stored headline is not chosen again: a schema-3 document whose headline is the
    # window although a timer is known keeps the window
    doc = json.loads((DATA / "v3-dp2-pp2-slow-rank1.json").read_text())
    doc.update(step_time_us=doc["window_us"], step_time_source="window")
    assert reader.read_summary(doc).step_time.source == "window"


def test_a_damaged_summary_is_named_by_its_field(tmp_path):
    doc = json.loads((DATA / "v3-dp2-pp2-slow-rank1.json").read_text())
    doc["per_rank_mean"][1]["window_us"] = "fast"
    with pytest.raises(reader.ReportError,
                       match=r"summary\.json \$\.per_rank_mean\[1\]\.window_us: expected a "
                             r"number, got str"):
        reader.read_summary(doc)
    doc = json.loads((DATA / "v2-replayed.json").read_text())
    doc["findings"].append("not a finding")
    with pytest.raises(reader.ReportError, match=r"\$\.findings\[1\]: expected an object"):
        reader.read_summary(doc)


# -- the samples, and what reading costs ---------------------------------------------------

@pytest.mark.parametrize("run_id", sorted(p.name for p in SAMPLES.iterdir()
                                          if (p / "report" / "summary.json").is_file()))
def test_every_sample_validates_against_the_schema(run_id):
    doc = json.loads((SAMPLES / run_id / "report" / "summary.json").read_text())
    assert doc["schema_version"] == REPORT_SCHEMA_VERSION, "samples/regenerate.sh"
    jsonschema.Draft202012Validator(summary_schema.schema()).validate(doc)
    typed = reader.read_summary(doc)
    assert codec.encode(typed) == doc


def test_reading_a_summary_imports_neither_pandas_nor_jsonschema():
    path = DATA / "v3-hta-trace-diff-test.json"
    code = ("import json, sys\n"
            "from meshscope.analysis.report import reader\n"
            f"s = reader.read_summary(json.loads(open({str(path)!r}).read()))\n"
            "assert s.top_kernels and s.gpu_idle_per_rank_mean\n"
            "print(sorted(m for m in ('pandas', 'jsonschema', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_summary_record_is_what_summary_json_holds():
    """The record's fields are the document's keys, in the order written."""
    doc = json.loads((SAMPLES / "dp2-pp2-slow-rank1" / "report" / "summary.json").read_text())
    assert list(doc) == [f.name for f in dataclasses.fields(Summary)]
