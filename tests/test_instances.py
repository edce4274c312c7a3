"""The collective-instance table on small hand-written traces whose answer is known by
construction: gloo calls paired with the ranges that ran them, the peer of a send, the algorithm
behind gloo's reduce_scatter, the Flight Recorder join, dimensions from run.json, and NCCL
kernels that take their bytes from the host op that launched them."""
import json

import msgspec
import pandas as pd
import pytest

from meshscope.analysis.comm import instances
from meshscope.analysis.ingest.events import load_trace
from meshscope.analysis.records.fr_table import FlightRecords
from meshscope.analysis.timeline import rank_timeline
from meshscope.collectors.flight_recorder import Dump
from meshscope.collectors.run_json import from_dict
from conftest import ROOT

BASE_NS = 1_000_000_000_000_000  # the trace's baseTimeNanoseconds


def _x(name, ts, dur, tid, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _trace(tmp_path, rank: int, events: list[dict], **meta) -> object:
    doc = {"traceEvents": events, "baseTimeNanoseconds": BASE_NS,
           "distributedInfo": {"rank": rank, "world_size": 4}, **meta}
    path = tmp_path / f"rank{rank}.json"
    path.write_text(json.dumps(doc))
    return load_trace(path)


RUN = from_dict({
    "world_size": 4, "layout": {"dp": 2, "pp": 2},
    "mesh": {"coordinates": {"0": {"pp": 0, "dp": 0}, "1": {"pp": 0, "dp": 1},
                             "2": {"pp": 1, "dp": 0}, "3": {"pp": 1, "dp": 1}}},
    "process_groups": [{"dimension": "pp", "ranks": [0, 2], "name": "1", "desc": "mesh_pp"},
                       {"dimension": "pp", "ranks": [1, 3], "name": "2", "desc": "mesh_pp"},
                       {"dimension": "dp", "ranks": [0, 1], "name": "3", "desc": "mesh_dp"},
                       {"dimension": "dp", "ranks": [2, 3], "name": "4", "desc": "mesh_dp"}],
    "schedule": "1f1b", "microbatches": 4}, "run.json")


def _gloo_step():
    """Rank 0 of dp=2 × pp=2: a send to its pipeline peer, a reduce_scatter gloo runs as an
    all_reduce, and DDP's asynchronous all_reduce on a worker thread."""
    return [
        _x("ProfilerStep#3", 0, 10_000, 1, cat="user_annotation"),
        _x("c10d::send", 100, 50, 1, **{"Input Dims": [[[2, 64, 64]], [], [], []],
                                        "Input type": ["TensorList", "", "Scalar", "Scalar"],
                                        "Concrete Inputs": ["", "", "1", "0"]}),
        _x("gloo:send", 120, 3000, 1, cat="user_annotation",
           **{"Input Dims": [[2, 64, 64]], "Input type": ["float"]}),
        _x("c10d::_reduce_scatter_base_", 4000, 30, 1,
           **{"Input Dims": [[128], [256], [], [], []],
              "Input type": ["float", "float", "", "", "Scalar"]}),
        _x("gloo:all_reduce", 4010, 400, 2, cat="user_annotation",
           **{"Input Dims": [[256]], "Input type": ["float"]}),
        _x("c10d::allreduce_", 6000, 60, 1,
           **{"Input Dims": [[[115456]], [], [], [], [], []],
              "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}),
        _x("gloo:all_reduce", 6020, 2500, 2, cat="user_annotation",
           **{"Input Dims": [[115456]], "Input type": ["float"]}),
    ]


def _finalize(trace, dump=None, run=RUN):
    """The instance table of ``trace``, with the hand-made Flight Recorder ``dump`` (a dict as
    the file holds it, checked as ``read_dump`` checks one) if given."""
    flight = FlightRecords.of([msgspec.convert({"schema_version": 1, **dump}, Dump)]) \
        if dump is not None else None
    tl = rank_timeline.build(trace)
    raw = instances.extract(trace, tl.on_gpu)
    return instances.finalize(raw, rank=trace.rank, meta=instances.small_meta(trace.meta),
                              timeline=tl, run=run, flight=flight)


def test_gloo_calls_paired_with_their_ranges(tmp_path):
    inst = _finalize(_trace(tmp_path, 0, _gloo_step()))
    assert inst["op"].tolist() == ["send", "reduce_scatter", "all_reduce"]
    send, rs, ar = (inst.iloc[i] for i in range(3))
    # The send's third argument is its group-local destination: rank 1 of pp group [0, 2].
    assert send["p2p"] and send["peer"] == 2 and send["pg_ranks"] == "0,2"
    assert send["dim"] == "pp" and send["msg_bytes"] == 2 * 64 * 64 * 4
    # gloo runs the reduce_scatter as an all_reduce of the whole input (256 floats): the row
    # keeps the algorithm, S = the whole input, and names the backend's op.
    assert rs["backend_op"] == "all_reduce" and rs["msg_bytes"] == 256 * 4
    assert rs["out_bytes"] == 128 * 4 and rs["exec_ts_us"] == 4010
    assert ar["arrival_us"] == 6000 and ar["end_us"] == 6020 + 2500
    # Without group arguments (gloo) or a Flight Recorder entry, the layout says dp: the one
    # dimension of size > 1 beside the pipeline; run.json then gives the group.
    assert ar["dim"] == "dp" and ar["dim_source"] == "layout" and ar["pg_ranks"] == "0,1"
    assert ar["msg_bytes"] == 115456 * 4 and pd.isna(ar["seq"])


def test_flight_recorder_entries_give_group_and_sequence_number(tmp_path):
    def entry(name, created_us, seq, pg, sizes):
        return {"profiling_name": name, "time_created_ns": BASE_NS + int(created_us * 1000),
                "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0,
                "is_p2p": False, "input_sizes": sizes, "output_sizes": sizes,
                "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled"}
    dump = {"rank": 0, "flight_recorder": {"entries": [
        entry("gloo:all_reduce", 4010, 7, ["3", "mesh_dp"], [[256]]),
        entry("gloo:all_reduce", 6030, 8, ["3", "mesh_dp"], [[115456]])]}}
    inst = _finalize(_trace(tmp_path, 0, _gloo_step()), dump)
    coll = inst[~inst["p2p"]]
    assert coll["seq"].tolist() == [7, 8]
    assert coll["pg_name"].tolist() == ["3", "3"] and coll["dim_source"].eq("trace").all()
    # Without run.json the group's ranks come from the trace's distributedInfo.pg_config.
    meta = {"distributedInfo": {"rank": 0, "world_size": 4, "pg_config": [
        {"pg_name": "3", "pg_desc": "mesh_dp", "ranks": [0, 1]}]}}
    inst = _finalize(_trace(tmp_path, 0, _gloo_step(), **meta), dump, run=None)
    assert inst.loc[~inst["p2p"], "pg_ranks"].tolist() == ["0,1", "0,1"]


def test_nccl_send_recv_kernels_of_an_all_to_all_take_bytes_from_their_host_op(tmp_path):
    """Old-format NCCL trace: the kernel carries no collective arguments; the host op
    ``nccl:all_to_all`` (with Input Dims) launched it — joined through the launch's
    correlation id."""
    events = [
        _x("ProfilerStep#0", 0, 5_000, 1, cat="user_annotation"),
        _x("nccl:all_to_all", 100, 80, 1, cat="user_annotation",
           **{"Input Dims": [[8, 1024]], "Input type": ["float"]}),
        _x("cudaLaunchKernel", 120, 10, 1, cat="cuda_runtime", correlation=42),
        _x("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 200, 900, 7,
           cat="kernel", device=0, stream=21, correlation=42),
        _x("aten::mm", 1500, 300, 1),
        _x("cudaLaunchKernel", 1510, 10, 1, cat="cuda_runtime", correlation=43),
        _x("ampere_sgemm", 1600, 400, 7, cat="kernel", device=0, stream=7, correlation=43),
    ]
    inst = _finalize(_trace(tmp_path, 0, events), run=None)
    (row,) = inst.itertuples()
    assert row.op == "all_to_all" and row.backend_op == "send_recv" and not row.p2p
    assert row.msg_bytes == 8 * 1024 * 4 and row.arrival_us == 200 and row.end_us == 1100
    assert row.source == "nccl"


def test_real_nccl_all_to_all_kernels_take_their_host_ops_bytes():
    """TorchRec-style job on A100s (trace_diff/control): its 42 all_to_all run as NCCL
    ``SendRecv`` kernels that carry no arguments; each becomes an all_to_all whose bytes are the
    ``Input Dims`` of the ``nccl:all_to_all`` range that launched it (read here from the file)."""
    import gzip
    import math

    from conftest import shared_trace

    path = shared_trace("gpu/hta/trace_diff/control/control.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    expected = sorted(math.prod(e["args"]["Input Dims"][0]) * 4 for e in doc["traceEvents"]
                      if e.get("name") == "nccl:all_to_all" and e.get("ph") == "X")
    inst = _finalize(load_trace(path), run=None)
    a2a = inst[inst["op"] == "all_to_all"]
    assert len(a2a) == len(expected) == 42
    assert (a2a["backend_op"] == "send_recv").all() and not a2a["p2p"].any()
    assert sorted(a2a["msg_bytes"].astype(int)) == expected


def test_layout_maps_a_foreign_jobs_groups_to_their_dimension(tmp_path):
    """A real DDP trace (two A100s, one process group without a mesh name): without --layout
    its exposed communication is of no known dimension; with ``--layout dp=2`` it is dp."""
    from conftest import meshscope, shared_trace

    src = shared_trace("gpu/hta/nccl_parser_config/nccl_data.json.gz")
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / src.name).write_bytes(src.read_bytes())
    plain = json.loads(meshscope("analyze", folder, "--json", check=True).stdout)
    mapped = json.loads(meshscope("analyze", folder, "--json", "--layout", "dp=2",
                                  check=True).stdout)
    before, after = plain["per_rank_mean"][0], mapped["per_rank_mean"][0]
    assert before["exposed_comm_unknown_us"] > 0 and before["exposed_comm_dp_us"] == 0
    assert after["exposed_comm_dp_us"] == pytest.approx(before["exposed_comm_unknown_us"])
    assert after["exposed_comm_unknown_us"] == 0
    bad = meshscope("analyze", folder, "--layout", "dp=2", "--rank-order", "dp-xx")
    assert bad.returncode == 2 and "--rank-order" in bad.stderr and "Traceback" not in bad.stderr


def test_every_dim_source_in_the_samples_is_in_the_vocabulary():
    """``dim_source`` is one of ``vocabulary.DIM_SOURCES`` on every committed sample (the MoE and DDP
    samples' instances all say ``flight_recorder``, which the vocabulary once lacked)."""
    from meshscope.vocabulary import DIM_SOURCES

    seen = set()
    for table in sorted((ROOT / "samples").glob("*/report/instances.parquet")):
        seen |= set(pd.read_parquet(table, columns=["dim_source"])["dim_source"])
    assert {"flight_recorder", "trace", "layout"} <= seen
    assert seen <= set(DIM_SOURCES), seen - set(DIM_SOURCES)
