"""One vocabulary (meshscope/vocabulary.py): every word the committed samples' reports use is
in it, and no other module spells its sets again.

The samples are reports the suite did not write for this test (``samples/``, regenerated on
purpose); every value of their dimension, source, op, finding and severity fields must be one
the vocabulary names, so a module that invents a new word without adding it there fails here.
"""
from __future__ import annotations

import json
import pathlib
import re

import pandas as pd
import pytest

from meshscope import vocabulary as V

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "samples").iterdir() if (p / "report" / "summary.json").is_file())


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_word_of_a_sample_report_is_in_the_vocabulary(sample):
    report = sample / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["device"] in V.DEVICES
    for f in summary["findings"]:
        assert f["id"] in V.FINDING_IDS, f["id"]
        assert f["severity"] in V.SEVERITIES, f["severity"]
        assert f["dimension"] in V.COMM_DIMS + ("all",), f["dimension"]
    inst = pd.read_parquet(report / "instances.parquet", columns=["op", "dim", "dim_source"])
    assert len(inst) > 0
    assert set(inst["op"]) <= set(V.OPS), set(inst["op"]) - set(V.OPS)
    assert set(inst["dim"]) <= set(V.COMM_DIMS), set(inst["dim"]) - set(V.COMM_DIMS)
    assert set(inst["dim_source"]) <= set(V.DIM_SOURCES)
    breakdown = pd.read_parquet(report / "breakdown.parquet")
    exposed = {m.group(1) for c in breakdown.columns
               if (m := re.fullmatch(r"exposed_comm_([a-z_]+)_us", c))}
    assert exposed and exposed <= set(V.COMM_DIMS), exposed


def test_the_samples_name_at_least_one_finding_of_each_kind_they_were_made_for():
    """The slow-rank sample's straggler and the pipeline samples' bubble are spelled as the
    vocabulary spells them (the sample README says which findings each sample shows)."""
    ids = {f["id"] for s in SAMPLES
           for f in json.loads((s / "report" / "summary.json").read_text())["findings"]}
    assert {"straggler", "pipeline-bubble"} <= ids, ids


def test_exposed_comm_ids_are_one_per_dimension_and_refuse_other_words():
    assert V.exposed_comm_id("pp") == "exposed-comm-pp"
    assert {V.exposed_comm_id(d) for d in V.COMM_DIMS} == \
        {f for f in V.FindingId if f.startswith(V.EXPOSED_COMM_PREFIX)}
    with pytest.raises(ValueError, match="unknown communication dimension 'world'"):
        V.exposed_comm_id("world")


# The sets the vocabulary holds, as another module would spell them again.
_RESPELLED = [
    re.compile(r"""\(\s*["']dp["'],\s*["']tp["'],\s*["']pp["'],\s*["']cp["'],\s*["']ep["']\s*[,)]"""),
    re.compile(r"""["']trace["'],\s*["']run\.json["'],\s*["']flight_recorder["']"""),
    re.compile(r"""["']all_reduce["'],\s*["']all_gather["'],\s*["']reduce_scatter["'],\s*"""
               r"""["']all_to_all["'],\s*["']broadcast["'],\s*["']reduce["']"""),
    re.compile(r"""["']dataloader["'],\s*["']sync["'],\s*["']wait_rank["']"""),
]


def test_no_module_spells_the_vocabulary_again():
    """The five dimensions, the dimension sources, the op names and the GPU idle causes are
    written in meshscope/vocabulary.py only (a layout's own subset, such as the planner's
    ``("dp", "tp", "pp", "cp")``, is another set and allowed)."""
    found = []
    for folder in ("analysis", "collectors", "dashboard", "parallel", "meshscope", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "vocabulary.py":
                continue
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}: {m.group(0)}"
                      for rx in _RESPELLED for m in rx.finditer(text)]
    assert not found, "\n".join(found)
