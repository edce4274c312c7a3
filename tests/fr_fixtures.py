"""Hand-made Flight Recorder dumps in PyTorch's own format, whose verdict is known by
construction.

``moe_job`` writes what the NCCL Flight Recorder of a 16-rank mixture-of-experts job holds
(the fields and forms of torch 2.13's ``_dump_fr_trace``: ``version`` "2.10", ``pg_config``
listing each rank's groups with their ranks as text, entries with ``record_id``,
``process_group`` as (name, desc), ``profiling_name`` ``nccl:<op>``, sizes, dtypes, state and
``time_created_ns``). The job: tensor parallel pairs (``mesh_tp``: {0,1}, {2,3} … {14,15})
and expert parallel groups of four (``mesh_ep``: {0,2,4,6}, {1,3,5,7}, {8,10,12,14},
{9,11,13,15}); each step issues a tp reduce_scatter, an ep all_to_all and a second tp
reduce_scatter. With ``hung``, those ranks finish the first reduce_scatter of step
``hang_step`` and issue nothing more (stuck in their own work); every other rank issues the
whole step — NCCL enqueues without waiting — and the ops of that step stay ``scheduled``.

By construction: the ep all_to_all of step ``hang_step`` is the earliest collective some
ranks never reached (ranks 5 and 13, in two ep groups), then the second tp reduce_scatter
(again 5 and 13, in their tp pairs) — while the reduce_scatters of every other pair proceed.
"""
from __future__ import annotations

import hashlib
import json
import pickle

WORLD = 16
TP = [[2 * i, 2 * i + 1] for i in range(8)]
EP = [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
STEP_NS = 1_000_000_000
BASE_NS = 1_790_000_000_000_000_000


def group_names(naming: str) -> dict[tuple[int, ...], str]:
    """Process group names as PyTorch gives them: ``counter`` — in creation order ("0" the
    default group, then tp, then ep), as ``new_group`` does; ``hashed`` — a hash of the ranks,
    as ``split_group`` / DeviceMesh do (here the tp pairs of ranks 5 and 13 sort before their
    ep groups, which a verdict ordered by group name would put first)."""
    groups = [tuple(g) for g in TP + EP]
    if naming == "counter":
        return {g: str(i + 1) for i, g in enumerate(groups)}
    return {g: ("0" if g in map(tuple, TP) else "f") + hashlib.sha1(str(list(g)).encode())
            .hexdigest()[:15] for g in groups}


def _entry(record_id, name, desc, seq, op, ins, outs, state, created):
    return {"record_id": record_id, "pg_id": 0, "process_group": (name, desc),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
            "profiling_name": f"nccl:{op}", "time_created_ns": created,
            "input_sizes": ins, "input_dtypes": ["Float"] * len(ins),
            "output_sizes": outs, "output_dtypes": ["Float"] * len(outs),
            "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed",
            "timeout_ms": 600000, "is_p2p": False, "frames": []}


def moe_dumps(*, steps: int = 4, hang_step: int | None = 2, hung=(5, 13),
              naming: str = "counter") -> dict[int, dict]:
    """rank → its dump (module docstring); ``hang_step`` None: a healthy job."""
    names = group_names(naming)
    tp_of = {r: tuple(g) for g in TP for r in g}
    ep_of = {r: tuple(g) for g in EP for r in g}
    out = {}
    for r in range(WORLD):
        tp, ep = tp_of[r], ep_of[r]
        pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(WORLD)))},
                     names[tp]: {"name": names[tp], "desc": "mesh_tp", "ranks": str(list(tp))},
                     names[ep]: {"name": names[ep], "desc": "mesh_ep", "ranks": str(list(ep))}}
        entries = []
        seq = {"tp": 0, "ep": 0}
        for step in range(steps if hang_step is None else hang_step + 1):
            t0 = BASE_NS + step * STEP_NS + r * 1000         # ranks issue microseconds apart
            program = [("tp", "reduce_scatter", [[128, 8]], [[64, 8]], 0),
                       ("ep", "all_to_all", [[64, 8]], [[64, 8]], 100_000_000),
                       ("tp", "reduce_scatter", [[128, 8]], [[64, 8]], 200_000_000)]
            for i, (dim, op, ins, outs, at) in enumerate(program):
                if step == hang_step and r in hung and i > 0:
                    break                       # stuck in its own work: issues nothing more
                # The hang step's first reduce_scatter completed everywhere; what follows it
                # waits in NCCL's queue on every rank that issued it.
                state = "scheduled" if step == hang_step and i > 0 else "completed"
                seq[dim] += 1
                g = tp if dim == "tp" else ep
                entries.append(_entry(len(entries), names[g], f"mesh_{dim}", seq[dim], op,
                                      ins, outs, state, t0 + at))
        out[r] = {"version": "2.10", "comm_lib_version": "2.27.5", "entries": entries,
                  "pg_config": pg_config, "pg_status": {}, "nccl_comm_state": {}}
    return out


def write_dumps(folder, dumps: dict[int, dict], *, form: str = "pickle",
                prefix: str = "_dump_") -> None:
    """Each rank's dump as PyTorch writes it: ``<prefix><rank>`` (a pickle), or its JSON form
    ``<prefix><rank>.json`` (process groups as lists, as JSON has no tuples)."""
    folder.mkdir(parents=True, exist_ok=True)
    for r, d in dumps.items():
        if form == "pickle":
            (folder / f"{prefix}{r}").write_bytes(pickle.dumps(d))
        else:
            (folder / f"{prefix}{r}.json").write_text(json.dumps(d))
