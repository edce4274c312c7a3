"""collectors/schemas/run.schema.json, collectors.schema.validate_run_json and the typed reader
collectors.run_json.read_run_info (schema plus the bounds a schema cannot state).

Checked against: the bundled samples, what the runner's launcher writes now (its
``run_description`` for several layouts, also as completed and failed), a Recorder's run.json
from a one-process run, and damaged files (the message names the file and the failing place).
"""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jsonschema
import pytest

from meshscope.collectors.run_dir import RunDirError
from meshscope.collectors.run_info import MAX_WORLD_SIZE
from meshscope.collectors.run_json import read_run_info
from meshscope.collectors.schema import SCHEMA_DIR, SCHEMA_PATH, json_path, validate_run_json
from conftest import ROOT

SAMPLE = ROOT / "samples" / "dp2-pp2-1f1b" / "run.json"


def test_schema_is_valid_draft_2020_12():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["required"]) == {"schema_version", "layout", "world_size", "mesh",
                                       "process_groups", "versions", "command", "start_time",
                                       "status"}


def test_sample_run_json_validates():
    desc = validate_run_json(SAMPLE)
    assert desc["layout_str"] == "dp=2,pp=2"
    assert validate_run_json(SAMPLE.parent) == desc, "a run directory is accepted too"
    for run in sorted((ROOT / "samples").glob("*/run.json")):
        info = read_run_info(run.parent)
        assert info.world_size == len(info.coordinates) == len(info.default_group.ranks)


def test_schemas_ship_inside_the_package():
    """pyproject's package data takes every schema the readers open, from inside the package
    (a non-editable install has them)."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert (ROOT / "meshscope" / "collectors").resolve() == ROOT / "collectors"
    patterns = data["package-data"]["meshscope.collectors"]
    shipped = {p for pattern in patterns for p in (ROOT / "collectors").glob(pattern)}
    assert SCHEMA_DIR == ROOT / "collectors" / "schemas"
    assert {SCHEMA_PATH, SCHEMA_DIR / "flight_recorder.schema.json"} <= shipped


@pytest.mark.parametrize("layout,extra", [
    ("dp=2,pp=2", {}),
    ("dp=2,tp=2", {"dp_mode": "fsdp"}),
    ("pp=2,ep=2,dp=2", {"schedule": "interleaved-1f1b"}),
    ("cp=2,tp=2", {"sp": False}),
])
def test_what_the_launcher_writes_validates(tmp_path, layout, extra):
    from meshscope.parallel.faults import Fault
    from meshscope.parallel.launch import RunOptions, run_description
    from meshscope.parallel.layout import parse_layout
    from meshscope.parallel.model import PRESETS

    preset = "tiny-moe" if "ep" in layout else "tiny"
    opts = RunOptions(layout=parse_layout(layout), model=PRESETS[preset], out=tmp_path,
                      profile_steps=(3, 5), model_preset=preset,
                      faults=[Fault("slow-rank", 1, 50)], **extra)
    desc = run_description(opts, "0123456789ab")
    path = tmp_path / "run.json"
    for status in ("running", "completed", "failed"):
        d = desc
        if status != "running":
            d = dataclasses.replace(d, status=status, end_time="2026-11-29T21:31:55+00:00")
        if status == "failed":
            d = dataclasses.replace(
                d, error="rank 1 failed (exit code 1): RuntimeError: injected crash")
        path.write_text(json.dumps(d.to_dict()))
        assert validate_run_json(path)["status"] == status
        info = read_run_info(tmp_path)
        assert info.world_size == opts.layout.world_size
        assert {k: v for k, v in info.layout.items() if v > 1} == opts.layout.sizes


RECORDER_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from meshscope.collectors import Recorder

dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp_shard", "tp"))
with Recorder(sys.argv[1], mesh=mesh, profile_steps=None, model_flops_per_token=1e6,
              peak_flops=1e12) as rec:
    for step in range(3):
        rec.step(loss=1.0 / (step + 1), tokens=16)
dist.destroy_process_group()
"""


def test_recorder_run_json_validates(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(RECORDER_SCRIPT))
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "100",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(out), str(tmp_path / "store")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    desc = validate_run_json(out / "run.json")
    assert desc["status"] == "completed" and desc["steps"] == 3
    assert desc["mesh"]["dims"] == ["dp_shard", "tp"]
    assert desc["layout"]["dp"] == 1 and desc["profile_steps"] is None
    assert desc["device"]["peak_flops"] == 1e12
    assert desc["device"]["peak_source"] == "Recorder arguments"
    assert not (out / "traces").exists(), "profile_steps=None records no trace"


def _broken(tmp_path, change) -> pathlib.Path:
    desc = json.loads(SAMPLE.read_text())
    change(desc)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(desc))
    return path


@pytest.mark.parametrize("change,where", [
    (lambda d: d.pop("world_size"), "$: 'world_size' is a required property"),
    (lambda d: d["process_groups"][2].update(ranks=[]), "$.process_groups[2].ranks"),
    (lambda d: d["mesh"]["coordinates"].update({"x": {"pp": 0}}), "$.mesh.coordinates"),
    (lambda d: d.update(schema_version=2), "$.schema_version"),
    (lambda d: d["layout"].update(tp=0), "$.layout.tp"),
    (lambda d: d.update(status="failed"), "'error' is a required property"),
    (lambda d: d.update(start_time="yesterday"), "$.start_time"),
])
def test_a_broken_run_json_is_named_with_its_path(tmp_path, change, where):
    path = _broken(tmp_path, change)
    with pytest.raises(RunDirError) as e:
        validate_run_json(path)
    assert str(e.value).startswith(f"{path}: ") and where in str(e.value)


def test_unreadable_run_json(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"schema_version": 1,')
    with pytest.raises(RunDirError, match="not readable JSON"):
        validate_run_json(path)
    with pytest.raises(RunDirError, match="missing: cannot read"):
        validate_run_json(tmp_path / "missing")
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RunDirError, match="nested deeper than the decoder's limit"):
        validate_run_json(path)
    path.write_text('{"schema_version": 1, "world_size": 1e400}')
    with pytest.raises(RunDirError, match="not readable JSON"):
        validate_run_json(path)


def _reads(tmp_path, change) -> pathlib.Path:
    _broken(tmp_path, change)
    return tmp_path


@pytest.mark.parametrize("change,where", [
    # what the schema states
    (lambda d: d.update(world_size="four"), "$.world_size: 'four' is not of type 'integer'"),
    (lambda d: d.update(world_size=10**9), "$.world_size: 1000000000 is greater than the "
                                           "maximum of 1048576"),
    (lambda d: d["layout"].update(pp="2"), "$.layout.pp: '2' is not of type 'integer'"),
    (lambda d: d.update(mesh=None), "$.mesh: None is not of type 'object'"),
    (lambda d: d.update(schedule=42), "$.schedule: 42 is not of type 'string', 'null'"),
    (lambda d: d["process_groups"][1].pop("dimension"), "$.process_groups[1]: 'dimension' is "
                                                         "a required property"),
    (lambda d: d.update(microbatches=0), "$.microbatches: 0 is less than the minimum of 1"),
    (lambda d: d["process_groups"][0].update(ranks=[0, 0]), "$.process_groups[0].ranks: "
                                                             "[0, 0] has non-unique elements"),
    (lambda d: d.update(seed=2**64), "$.seed"),
    (lambda d: d.update(command=list(range(10_000))), "$.command[0]: 0 is not of type "
                                                      "'string' (and 9999 more)"),
    (lambda d: d.update(schema_version=2), "$.schema_version: unknown version 2 (this "
                                           "meshscope reads version 1)"),
    # the bounds the schema cannot state (collectors/run_json.check_bounds)
    (lambda d: d["layout"].update(dp=3), "$.layout: dp=2,pp=2: the dimensions multiply to 6 "
                                         "ranks, but world_size is 4"),
    (lambda d: d["mesh"].update(shape=[2, 3]), "$.mesh.shape: [2, 3] holds 6 ranks"),
    (lambda d: d["mesh"].update(shape=[4]), "$.mesh.shape: 1 sizes for 2 dimensions"),
    (lambda d: d["mesh"]["coordinates"].update({"4": {"pp": 0, "dp": 0}}),
     "$.mesh.coordinates.4: rank 4 is not below world_size 4"),
    (lambda d: d["mesh"]["coordinates"]["3"].update(pp=2),
     "$.mesh.coordinates.3.pp: index 2 is not below the mesh's pp size 2"),
    (lambda d: d["mesh"]["coordinates"]["3"].update(pp=0, dp=0),
     "$.mesh.coordinates.3: the same coordinates as rank 0"),
    (lambda d: d["process_groups"][2].update(ranks=[0, 7]),
     "$.process_groups[2].ranks: rank 7 is not below world_size 4"),
    (lambda d: d["pipeline"].update(stages=4), "$.pipeline.stages: 4 stages, but the layout "
                                               "has pp=2"),
    (lambda d: d["pipeline"].update(microbatches=8), "$.pipeline.microbatches: 8, but "
                                                     "$.microbatches is 4"),
    (lambda d: d["pipeline"].update(stage_layers=[[0, 1, 2, 3]]),
     "$.pipeline.stage_layers: 1 stages listed, but pp × virtual_stages is 2"),
    (lambda d: d.update(profile_steps=[5, 4]), "$.profile_steps: [5, 4] ends before it starts"),
    (lambda d: d.update(profile_steps=[4, 6]), "$.profile_steps: step 6 is not below steps"),
    (lambda d: d.update(faults=[{"kind": "slow-rank", "rank": 9, "value": 1}]),
     "$.faults[0].rank: rank 9 is not below world_size 4"),
])
def test_read_run_info_names_the_field(tmp_path, change, where):
    run = _reads(tmp_path, change)
    with pytest.raises(RunDirError) as e:
        read_run_info(run)
    assert str(e.value).startswith(f"{run / 'run.json'}: {where}"), str(e.value)
    assert len(str(e.value)) < 400


def test_world_size_bound_is_the_package_limit():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["properties"]["world_size"]["maximum"] == MAX_WORLD_SIZE
    assert schema["$defs"]["rank"]["maximum"] == MAX_WORLD_SIZE - 1


def test_json_path():
    assert json_path([]) == "$"
    assert json_path(["mesh", "shape", 0]) == "$.mesh.shape[0]"


@pytest.mark.parametrize("sample", sorted(p.parent.name for p in (ROOT / "samples").glob("*/run.json")))
def test_run_info_writes_back_what_it_read(sample):
    """``RunInfo.to_dict`` is run.json's one writer: every committed sample's run.json, read
    and written again, is the same document — the same keys in the same order, the same
    values — and reading that back gives the same RunInfo."""
    from meshscope.collectors.run_json import from_dict

    path = ROOT / "samples" / sample / "run.json"
    doc = json.loads(path.read_text())
    info = from_dict(doc, path)
    written = info.to_dict()
    assert written == doc
    assert _key_order(written) == _key_order(doc)
    assert from_dict(written, path) == info


def _key_order(doc):
    """Every object's keys, in order, through the whole document (a number read as a float
    is written as one — 1287552.0 for 1287552 — so the text itself is not compared)."""
    if isinstance(doc, dict):
        return [(k, _key_order(v)) for k, v in doc.items()]
    if isinstance(doc, list):
        return [_key_order(v) for v in doc]
    return None


def test_launcher_description_is_a_run_info_its_file_reads_back_as(tmp_path):
    """The launcher builds a RunInfo (``run_description``) and writes its dict; reading the
    file gives the same record, a failed run's error and end included."""
    import dataclasses

    from meshscope.parallel.launch import RunOptions, run_description
    from meshscope.parallel.layout import parse_layout
    from meshscope.parallel.model import PRESETS

    opts = RunOptions(layout=parse_layout("dp=2,pp=2"), model=PRESETS["tiny"], out=tmp_path,
                      profile_steps=(1, 2))
    info = dataclasses.replace(run_description(opts, "0123456789ab"), status="failed",
                               end_time="2026-11-29T21:31:55+00:00", error="rank 1 failed")
    (tmp_path / "run.json").write_text(json.dumps(info.to_dict()))
    back = read_run_info(tmp_path)
    assert back == dataclasses.replace(info, path=tmp_path / "run.json")
    assert back.error == "rank 1 failed" and back.status == "failed"
    assert list(info.to_dict())[-1] == "error"
