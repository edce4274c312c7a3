"""Synthetic run directories that look like the runner's: any rank count, no training.

``make_run(out, ranks=64, events_per_step=30000, layout="dp=32,pp=2", slow_rank=5,
slow_ms=20)`` writes a complete run directory — ``run.json`` (valid against
docs/run.schema.json), ``traces/rank{R}.json.gz``, ``steps/rank{R}.parquet`` and
``comms/rank{R}.json`` — for benchmarks and tests that need more ranks, or bigger traces, than
this machine can train (the scale benchmark, ``bench/scale.py``; the memory-relation test; the
dashboard's latency benchmark). From the command line::

    .venv/bin/python -m bench.synth /tmp/synth-64 --ranks 64 --events-per-step 30000 \\
        --layout dp=32,pp=2 --slow-rank 5 --slow-ms 20

**What the traces hold.** The structure of a CPU/gloo trace of ``meshscope run`` under torch
2.13 (``samples/*/traces``), in Kineto's own text layout: ``distributedInfo`` with every group
the rank belongs to (``pg_config``), ``baseTimeNanoseconds``, the ``meshscope`` metadata; on the
main thread ``ProfilerStep#N``, ``Optimizer.zero_grad#AdamW.zero_grad``, ``meshscope/pipeline``,
one ``meshscope/forward|backward stage=S chunk=0 mb=M`` range per microbatch (with
``DistributedDataParallel.forward`` inside the forward when dp > 1) holding trees of ``aten::``
ops with ``Input Dims`` / ``Input type`` / ``Concrete Inputs`` arguments and ``fwdbwd`` flow
events from each forward op to its backward, the DDP bucket enqueues ``c10d::allreduce_`` inside
the last backward, ``c10d::send`` / ``c10d::recv_`` with ``gloo:send`` / ``gloo:recv`` between
microbatches of a pipeline, and ``meshscope/optimizer``; each bucket's ``gloo:all_reduce`` on
one of two gloo worker threads; the profiler's closing ``Trace`` span and instant events.

**How the times are made.** Each rank runs a program — the microbatches of its schedule (a
microbatch loop without pipeline parallelism, 1F1B with it) and its collectives — in a
discrete-event simulation (``_simulate``) with two kinds of meeting point, as gloo has them:

- a *collective* (a DDP bucket's all-reduce over the rank's dp group) is enqueued during the
  last backward and waited for at its end; it ends on every rank of the group at the same
  moment, ``latency + 2(n−1)/n · S / bandwidth`` after its last arrival (and after the group's
  previous collective: gloo runs a group's collectives in order);
- a *point-to-point batch* (torch.distributed.pipelining's ``batch_isend_irecv``: the sends
  after one microbatch with the receives before the next) waits for all its transfers; each
  ends on both sides at the same moment, ``latency + S / bandwidth`` after the later of the
  two posts.

So collectives match across ranks (same groups, same order, consistent times), a receive
blocked on its sender shows a long ``gloo:recv``, and the peers of a slow rank wait for it in
their collectives. Compute takes about ``US_PER_EVENT`` µs per trace event, with a few percent
of seeded per-rank, per-microbatch noise; ``slow_rank`` has its compute stretched by
``slow_ms`` per step. The Flight Recorder dumps hold DDP's set-up collectives and every
all-reduce of every step, with per-group sequence numbers, created at the instant of the
``c10d::allreduce_`` call in the trace (``time_created_ns − baseTimeNanoseconds`` falls inside
it); point-to-point operations are not recorded, as with gloo. The step timers cover every step,
the ``WARMUP_STEPS`` slower unprofiled ones first; the traces cover the ``steps`` profiled ones.

Output is a function of the arguments only (a fixed epoch, seeded noise): the same call writes
the same bytes. Generation runs the simulation here and writes the traces in ``workers``
processes; the text of each microbatch is laid out once as a template and every instance is
one join of its pieces with the instance's numbers (``Block``), so a rank of 100k events per
step takes about a second (docs/benchmarks.md, "Synthetic runs").
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import json
import math
import multiprocessing as mp
import os
import pathlib
import platform
import shutil
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from meshscope.collectors import flight_recorder
from meshscope.collectors import run_dir as rd
from meshscope.collectors.step_timer import SCHEMA as STEP_SCHEMA
from meshscope.collectors.annotations import OPTIMIZER, PIPELINE, microbatch
from meshscope.parallel.config import PRESETS
from meshscope.parallel.layout import Layout, LayoutError, parse_layout, stage_layers
from meshscope.vocabulary import PARALLEL_DIMS

WARMUP_STEPS = 2            # unprofiled steps before the profiled ones (step timers only)
WARMUP_SLOWDOWN = (1.45, 1.02)  # compute of those steps against a profiled step's (the runner: ~1.4, ~1.0)
US_PER_EVENT = 8.0          # compute time per trace event (the runner's CPU traces: ~8 µs)
NOISE = 0.03                # relative spread of a microbatch's compute (seeded)
HOST_GAP_US = (15.0, 60.0)  # Python between two actions of the main thread
BANDWIDTH_BYTES_PER_US = 1000.0   # gloo over loopback, about 1 GB/s
LATENCY_US = 30.0
CALL_US = 40.0              # a c10d:: call that enqueues work (send, recv_, allreduce_)
BUCKETS = 2                 # DDP gradient buckets per step
MODEL = "tiny"              # sizes recorded in run.json and in the ops' Input Dims
MICROBATCH_ROWS = 2         # sequences per microbatch (the ops' Input Dims)
EPOCH_NS = 1_790_857_026_000_000_000  # baseTimeNanoseconds (as Kineto rounds it)
T0_US = 5_134_033_834_000.0  # the first step's start on the trace clock
SUPPORTED_DIMS = ("dp", "pp")


# -- layout and process groups ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Group:
    name: str          # torch's group name: "0" for the default group, then "1", "2", …
    desc: str          # default_pg, mesh_pp, mesh_dp
    dim: str
    ranks: tuple[int, ...]


def _layout(ranks: int, layout: str | None) -> Layout:
    lay = parse_layout(layout) if layout else Layout({"dp": ranks})
    extra = [d for d, n in lay.sizes.items() if n > 1 and d not in SUPPORTED_DIMS]
    if extra:
        raise LayoutError(f"layout {lay}: the generator makes dp and pp only, not {extra[0]}")
    if lay.world_size != ranks:
        raise LayoutError(f"layout {lay} has {lay.world_size} ranks, not {ranks}")
    return lay


def _groups(lay: Layout) -> list[Group]:
    """The groups a DeviceMesh over (pp, dp) creates, named as torch names them: in order of
    creation, pp's groups first; a group spanning the world is the default group."""
    world = tuple(range(lay.world_size))
    out, n = [Group("0", "default_pg", "world", world)], 1
    for dim in ("pp", "dp"):
        for ranks in lay.groups(dim):
            if tuple(ranks) == world:
                out[0] = Group("0", "default_pg", dim, world)
                continue
            out.append(Group(str(n), f"mesh_{dim}", dim, tuple(ranks)))
            n += 1
    return out


def _rank_groups(groups: list[Group], rank: int) -> list[Group]:
    """The groups ``rank`` is in, default group first (``pg_config`` order, Flight Recorder
    ``pg_id`` = index here)."""
    return [g for g in groups if rank in g.ranks]


def _group_of(groups: list[Group], rank: int, dim: str) -> Group:
    return next(g for g in groups if g.dim == dim and rank in g.ranks)


# -- op templates ----------------------------------------------------------------------------

def _j(x) -> str:
    return json.dumps(x)


def _args(types, dims, scalars=None, seq=None) -> str:
    """The ``args`` text of a recorded op (without External id / Ev Idx), as Kineto writes it."""
    parts = []
    if seq is not None:
        parts.append(f'"Sequence number": {seq}, "Fwd thread id": 0')
    parts.append('"Record function id": 0')
    scalars = scalars if scalars is not None else [""] * len(types)
    strides = [[] if not d else _strides(d) for d in dims]
    parts.append(f'"Concrete Inputs": {_j(scalars)}, "Input type": {_j(types)}, '
                 f'"Input Strides": {_j(strides)}, "Input Dims": {_j(dims)}')
    return ", ".join(parts)


def _strides(dims) -> list:
    if dims and isinstance(dims[0], list):
        return [_strides(d) for d in dims]
    out, s = [], 1
    for d in reversed(dims):
        out.append(s)
        s *= d
    return out[::-1]


@dataclasses.dataclass
class Op:
    """One recorded op and the ops it called; ``weight`` is its share of its parent's time."""
    name: str
    args: str | None
    weight: float = 1.0
    children: list["Op"] = dataclasses.field(default_factory=list)
    cat: str = "cpu_op"
    flow: bool = False   # a root that autograd links forward → backward (a fwdbwd flow)

    def count(self) -> int:
        """Its complete events: itself and everything below it."""
        return 1 + sum(c.count() for c in self.children)


def _forward_roots(rows: int, seq: int, dim: int, ffn: int) -> list[Op]:
    """One transformer block's forward on CPU, as the profiler records it (shapes of the tiny
    model): RMSNorm, q/k/v/o and SwiGLU projections, attention, residual adds."""
    x, tok = [rows, seq, dim], rows * seq
    flat = [tok, dim]
    F = ["float"]

    def linear(out):
        return Op("aten::linear", _args(F * 2 + [""], [x, [out, dim], []]), 6.0, [
            Op("aten::t", _args(F, [[out, dim]]), 0.1, [
                Op("aten::transpose", _args(F + ["Scalar", "Scalar"], [[out, dim], [], []],
                                            ["", "0", "1"]), 0.6, [
                    Op("aten::as_strided", _args(F + ["ScalarList", "ScalarList", "Scalar"],
                                                 [[out, dim], [], [], []],
                                                 ["", f"[{dim}, {out}]", f"[1, {dim}]", "0"]),
                       0.5)])]),
            Op("aten::matmul", _args(F * 2, [x, [dim, out]]), 5.0, [
                Op("aten::reshape", _args(F + ["ScalarList"], [x, []], ["", f"[{tok}, {dim}]"]),
                   0.1, [Op("aten::view", _args(F + ["ScalarList"], [x, []],
                                                ["", f"[{tok}, {dim}]"]), 0.5)]),
                Op("aten::mm", _args(F * 2, [flat, [dim, out]]), 4.0),
                Op("aten::_unsafe_view", _args(F + ["ScalarList"], [[tok, out], []],
                                               ["", f"[{rows}, {seq}, {out}]"]), 0.1)])])

    def norm():
        return [
            Op("aten::pow", _args(F + ["Scalar"], [x, []], ["", "2"], seq), 1.0),
            Op("aten::mean", _args(F + ["ScalarList", "Scalar", ""], [x, [], [], []],
                                   ["", "[-1]", "True", ""], seq), 2.0, [
                Op("aten::sum", _args(F + ["ScalarList", "Scalar", "Scalar", "float"],
                                      [x, [], [], [], [rows, seq, 1]],
                                      ["", "[-1]", "True", "6", ""]), 0.4, [
                    Op("aten::fill_", _args(F + ["Scalar"], [[rows, seq, 1], []], ["", "0."]),
                       0.2)]),
                Op("aten::div_", _args(F + ["Scalar"], [[rows, seq, 1], []], ["", str(dim)]),
                   0.4)]),
            Op("aten::add", _args(F + ["double", "Scalar"], [[rows, seq, 1], [], []],
                                  ["", "", "1"], seq), 0.4),
            Op("aten::rsqrt", _args(F, [[rows, seq, 1]], None, seq), 0.3),
            Op("aten::mul", _args(F * 2, [x, [rows, seq, 1]], None, seq), 0.8),
            Op("aten::mul", _args(F * 2, [x, [dim]], None, seq), 0.8),
        ]

    attn = Op("aten::scaled_dot_product_attention",
              _args(F * 3 + ["", "Scalar", "Scalar", "", "Scalar"],
                    [[rows, 4, seq, dim // 4]] * 3 + [[], [], [], [], []],
                    ["", "", "", "", "0.", "True", "", "False"], seq), 6.0, [
        Op("aten::_scaled_dot_product_flash_attention_for_cpu",
           _args(F * 3 + ["Scalar", "Scalar", "", ""],
                 [[rows, 4, seq, dim // 4]] * 3 + [[], [], [], []],
                 ["", "", "", "0.", "True", "", ""]), 5.0, [
            Op("aten::empty", _args(["ScalarList", "Scalar", "Scalar", "", "", ""],
                                    [[], [], [], [], [], []],
                                    [f"[{rows}, {seq}, 4, {dim // 4}]", "6", "0", "", "", ""]),
               0.1)])])
    roots = norm() + [linear(dim), linear(dim), linear(dim), attn, linear(dim)]
    roots += [Op("aten::add", _args(F * 2 + ["Scalar"], [x, x, []], ["", "", "1"], seq), 0.5)]
    roots += norm() + [linear(ffn), linear(ffn),
                       Op("aten::silu", _args(F, [[rows, seq, ffn]], None, seq), 1.0),
                       Op("aten::mul", _args(F * 2, [[rows, seq, ffn]] * 2, None, seq), 0.8),
                       linear(dim),
                       Op("aten::add", _args(F * 2 + ["Scalar"], [x, x, []], ["", "", "1"],
                                             seq), 0.5)]
    for r in roots:
        r.flow = r.name != "aten::linear"
    return roots


def _backward_roots(rows: int, seq: int, dim: int, ffn: int) -> list[Op]:
    """One transformer block's backward: autograd's evaluate_function nodes and the ops inside,
    and the gradient accumulation of its weights."""
    x, tok = [rows, seq, dim], rows * seq
    F = ["float"]

    def node(grad_fn, inner, weight):
        return Op(f"autograd::engine::evaluate_function: {grad_fn}", None, weight, [
            Op(grad_fn, None, 0.95, inner)], flow=True)

    def mm_backward(out):
        return node("MmBackward0", [
            Op("aten::t", _args(F, [[tok, dim]]), 0.1, [
                Op("aten::transpose", _args(F + ["Scalar", "Scalar"], [[tok, dim], [], []],
                                            ["", "0", "1"]), 0.6, [
                    Op("aten::as_strided", _args(F + ["ScalarList", "ScalarList", "Scalar"],
                                                 [[tok, dim], [], [], []],
                                                 ["", f"[{dim}, {tok}]", f"[1, {dim}]", "0"]),
                       0.5)])]),
            Op("aten::mm", _args(F * 2, [[tok, out], [out, dim]]), 4.0),
            Op("aten::mm", _args(F * 2, [[out, tok], [tok, dim]]), 4.0)], 10.0)

    def accumulate(shape):
        return Op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", None,
                  0.6, [Op("torch::autograd::AccumulateGrad", None, 0.9, [
                      Op("aten::add_", _args(F * 2 + ["Scalar"], [shape, shape, []],
                                             ["", "", "1"]), 0.8)])])

    def elementwise(grad_fn, shape):
        return node(grad_fn, [Op("aten::mul", _args(F * 2, [shape, shape]), 0.45),
                              Op("aten::mul", _args(F * 2, [shape, shape]), 0.45)], 1.5)

    roots = [node("AddBackward0", [], 0.2), mm_backward(ffn), accumulate([dim, ffn]),
             elementwise("MulBackward0", [rows, seq, ffn]),
             elementwise("SiluBackward0", [rows, seq, ffn]), mm_backward(dim),
             accumulate([ffn, dim]), mm_backward(dim), accumulate([ffn, dim]),
             elementwise("MulBackward0", x), elementwise("MulBackward0", x),
             node("ViewBackward0", [Op("aten::view", _args(F + ["ScalarList"], [x, []],
                                                          ["", f"[{tok}, {dim}]"]), 0.5)], 0.3),
             node("ScaledDotProductFlashAttentionForCpuBackward0", [
                 Op("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                    _args(F * 4, [[rows, 4, seq, dim // 4]] * 4), 0.9)], 8.0)]
    for _ in range(3):
        roots += [mm_backward(dim), accumulate([dim, dim])]
    roots += [elementwise("MulBackward0", x), elementwise("PowBackward0", x),
              node("MeanBackward1", [Op("aten::expand", _args(F + ["ScalarList", "Scalar"],
                                                            [[rows, seq, 1], [], []]), 0.2)],
                   0.5)]
    return roots


def _optimizer_ops(dim: int, ffn: int) -> list[Op]:
    F = ["float"]
    shape = [dim, ffn]
    return [Op("aten::_foreach_mul_", _args(["TensorList", "Scalar"], [[shape], []]), 1.0),
            Op("aten::_foreach_add_", _args(["TensorList", "TensorList", "Scalar"],
                                            [[shape], [shape], []]), 1.0),
            Op("aten::_foreach_lerp_", _args(["TensorList", "TensorList", "Scalar"],
                                             [[shape], [shape], []]), 1.0),
            Op("aten::_foreach_sqrt", _args(["TensorList"], [[shape]]), 1.0),
            Op("aten::_foreach_addcdiv_", _args(["TensorList"] * 3 + ["Scalar"],
                                                [[shape]] * 3 + [[]]), 1.2),
            Op("aten::copy_", _args(F * 2 + ["Scalar"], [shape, shape, []]), 0.3)]


def _fill(pattern: list[Op], events: int) -> list[Op]:
    """Repeat ``pattern`` (one block's roots) until the roots hold about ``events`` events
    (a flow event counted for each root that may carry one)."""
    out, n, i = [], 0, 0
    while n < events or not out:
        op = pattern[i % len(pattern)]
        out.append(op)
        n += op.count() + op.flow   # a flow event for roots that may have one
        i += 1
    return out


# -- the text of a block of events, assembled from a template --------------------------------

# A template is Kineto's text with HOLE where a value goes; the values of an event are
# (pid, tid, ts µs, ts thousandths, dur µs, dur thousandths, External id, Ev Idx) for a
# complete event and (flow id, pid, tid, ts µs, ts thousandths) for a flow event. Times are
# written as two integers: joining precomputed strings is several times faster than
# formatting floats, which matters at 100k events per rank and step.
HOLE = "\x00"
_FRAC = np.array([f"{i:03d}" for i in range(1000)], dtype=object)


def _x_template(name: str, cat: str, args: str | None) -> str:
    """Kineto's text of one complete event (``HOLE``s for its values)."""
    extra = "" if args is None else args + ", "
    return ('  {\n    "ph": "X",\n    "cat": "' + cat + '",\n    "name": "' + name +
            '",\n    "pid": \x00,\n    "tid": \x00,\n    "ts": \x00.\x00,\n    "dur": \x00.\x00\n'
            '    ,\n    "args": {\n      "External id": \x00,' + extra + '"Ev Idx": \x00\n    }\n'
            '  },\n')


def _flow_template(ph: str) -> str:
    """A ``fwdbwd`` flow event (start ``s`` after a forward op, end ``f`` at its backward)."""
    bp = ', "bp": "e"' if ph == "f" else ""
    return ('  {\n    "ph": "' + ph + '",\n    "id": \x00,\n    "pid": \x00,\n    "tid": \x00,'
            '\n    "ts": \x00.\x00,\n    "cat": "fwdbwd",\n    "name": "fwdbwd"\n    ' + bp +
            '\n  },\n')


def _fill_holes(pieces: list[str], values: list[str]) -> str:
    out = [""] * (2 * len(pieces) - 1)
    out[0::2] = pieces
    out[1::2] = values
    return "".join(out)


def x_event(name: str, cat: str, pid: int, tid: int, ts: float, dur: float, ext: int,
            args: str | None = None) -> str:
    """The text of one complete event."""
    ts_ns, dur_ns = round(ts * 1000), round(dur * 1000)
    values = [pid, tid, ts_ns // 1000, _FRAC[ts_ns % 1000], dur_ns // 1000,
              _FRAC[dur_ns % 1000], ext, ext]
    return _fill_holes(_x_template(name, cat, args).split(HOLE), list(map(str, values)))


@dataclasses.dataclass
class Block:
    """The events inside a range of the main thread (a microbatch's ops, the optimizer's),
    laid out once: each event's start and duration as fractions of the block's compute time D.

    ``pieces`` is the text of all its events cut at the holes; ``gather`` says, for each hole
    in order, which entry of ``_render``'s values (pid, tid, then per event its start,
    duration and id, then the flow ids) fills it, so an instance is a gather and one join.
    ``slots``: where (fractions of D) the ``c10d::`` calls laid into the block start (DDP's
    bucket enqueues)."""
    pieces: list[str]
    rel_ts: np.ndarray
    rel_dur: np.ndarray
    n_flow: int
    gather: np.ndarray
    slots: list[float]

    @property
    def n_events(self) -> int:
        return len(self.rel_ts) + self.n_flow


def _block(inner: list[str], roots: list[Op], *, flows: int = 0, flow_ph: str = "s",
           slots: tuple[tuple[int, Op], ...] = ()) -> Block:
    """Lay out ``roots`` over [0, 1), inside the nested ranges ``inner``: each root gets time
    in proportion to its weight, with a gap of Python between roots; an op's children share
    90% of its time by weight. The first ``flows`` roots that may carry a flow event get one.
    ``slots``: (root index, op) pairs, each op placed before that root."""
    roots = list(roots)
    slot_ops = set()
    for index, op in sorted(slots, key=lambda s: -s[0]):
        roots.insert(index, op)
        slot_ops.add(id(op))
    texts, rel_ts, rel_dur = [], [], []
    fields = []  # per placeholder group: ("x", event index) or ("flow", flow index, event)
    pad = 0.004
    for depth, name in enumerate(inner):
        texts.append(_x_template(name, "user_annotation", None))
        rel_ts.append(pad * (depth + 1))
        rel_dur.append(1.0 - 2 * pad * (depth + 1))
        fields.append(("x", len(rel_ts) - 1))
    lo, hi = pad * (len(inner) + 1), 1.0 - pad * (len(inner) + 1)
    gap = 0.08 * (hi - lo) / len(roots)
    scale = ((hi - lo) - gap * len(roots)) / sum(r.weight for r in roots)
    n_flow = 0
    slot_starts = []

    def place(op: Op, start: float, dur: float, root: bool):
        nonlocal n_flow
        texts.append(_x_template(op.name, op.cat, op.args))
        rel_ts.append(start)
        rel_dur.append(dur)
        me = len(rel_ts) - 1
        fields.append(("x", me))
        if root and op.flow and n_flow < flows:
            texts.append(_flow_template(flow_ph))
            fields.append(("flow", n_flow, me))
            n_flow += 1
        if op.children:
            weights = sum(c.weight for c in op.children)
            step = dur * 0.1 / (len(op.children) + 1)
            t = start + step
            for c in op.children:
                d = dur * 0.9 * c.weight / weights
                place(c, t, d, False)
                t += d + step

    t = lo
    for op in roots:
        d = scale * op.weight
        if id(op) in slot_ops:
            slot_starts.append(t + gap / 2)
        place(op, t + gap / 2, d, True)
        t += d + gap
    nx = len(rel_ts)
    gather = []
    for f in fields:   # _render's values: pid, tid, ts µs, ts ‰, dur µs, dur ‰, ids, flow ids
        if f[0] == "x":
            i = 2 + f[1]
            gather += [0, 1, i, nx + i, 2 * nx + i, 3 * nx + i, 4 * nx + i, 4 * nx + i]
        else:
            i = 2 + f[2]                                   # the op the flow starts or ends at
            gather += [2 + 5 * nx + f[1], 0, 1, i, nx + i]
    pieces = "".join(texts).split(HOLE)
    assert len(pieces) == len(gather) + 1
    return Block(pieces, np.asarray(rel_ts), np.asarray(rel_dur), n_flow,
                 np.asarray(gather, dtype=np.int64), slot_starts)


def _render(block: Block, pid: int, tid: int, start_us: float, compute_us: float,
            first_id: int, first_flow: int) -> str:
    """The text of one instance of ``block``: its ops start ``start_us`` and take their share
    of ``compute_us``; ids count from ``first_id``, flow ids from ``first_flow``."""
    nx = len(block.rel_ts)
    ts = np.rint((start_us + block.rel_ts * compute_us) * 1000.0).astype(np.int64)
    dur = np.rint(block.rel_dur * compute_us * 1000.0).astype(np.int64)
    values = np.empty(2 + 5 * nx + block.n_flow, dtype=object)
    values[0], values[1] = str(pid), str(tid)
    values[2:2 + nx] = list(map(str, (ts // 1000).tolist()))
    values[2 + nx:2 + 2 * nx] = _FRAC[ts % 1000]
    values[2 + 2 * nx:2 + 3 * nx] = list(map(str, (dur // 1000).tolist()))
    values[2 + 3 * nx:2 + 4 * nx] = _FRAC[dur % 1000]
    values[2 + 4 * nx:2 + 5 * nx] = list(map(str, range(first_id, first_id + nx)))
    values[2 + 5 * nx:] = list(map(str, range(first_flow, first_flow + block.n_flow)))
    return _fill_holes(block.pieces, values[block.gather].tolist())


# -- the plan, the programs and their simulation ---------------------------------------------

@dataclasses.dataclass
class Plan:
    """What every rank's program and text need."""
    lay: Layout
    groups: list[Group]
    steps: int                   # profiled steps
    microbatches: int
    fwd: Block
    bwd: Block
    bwd_last: Block              # the last microbatch's backward, with DDP's bucket enqueues
    opt: Block
    bucket_nelems: list[int]
    act_shape: list[int]
    slow_rank: int | None
    slow_us: float
    seed: int
    run_id: str

    @property
    def total_steps(self) -> int:
        return WARMUP_STEPS + self.steps


def _plan(ranks: int, steps: int, events_per_step: int, layout: str | None,
          slow_rank: int | None, slow_ms: float, seed: int, microbatches: int | None) -> Plan:
    lay = _layout(ranks, layout)
    if steps < 1:
        raise ValueError("steps must be at least 1")
    if slow_rank is not None and not 0 <= slow_rank < ranks:
        raise ValueError(f"slow_rank {slow_rank} is not in 0..{ranks - 1}")
    if slow_ms < 0:
        raise ValueError(f"slow_ms must not be negative, not {slow_ms}")
    pp, dp = lay.size("pp"), lay.size("dp")
    m = microbatches or max(4, pp)
    if m < pp:
        raise ValueError(f"1F1B needs at least as many microbatches as stages ({pp}), not {m}")
    cfg = PRESETS[MODEL]
    rows, seq, dim, ffn = MICROBATCH_ROWS, cfg.seq_len, cfg.dim, cfg.ffn_hidden
    # Events of a step outside the microbatches' ops: step, zero_grad, pipeline, optimizer
    # ranges; per microbatch its range(s) and its sends and receives; the buckets.
    fixed = 5 + m * (3 if dp > 1 else 2) + (6 * m if pp > 1 else 0) + 2 * BUCKETS
    budget = max(events_per_step - fixed, 40 * m)
    opt_events = max(8, budget // 50)
    ddp = ["DistributedDataParallel.forward"] if dp > 1 else []
    fwd_pattern = _forward_roots(rows, seq, dim, ffn)
    bwd_pattern = _backward_roots(rows, seq, dim, ffn)
    target = (budget - opt_events) / m   # a microbatch's forward and backward events
    for _ in range(2):   # once as estimated, once scaled by what the first try gave
        fwd_roots = _fill(fwd_pattern, int(target / 3))
        bwd_roots = _fill(bwd_pattern, int(target * 2 / 3))
        flows = min(sum(r.flow for r in fwd_roots), sum(r.flow for r in bwd_roots))
        fwd = _block(ddp, fwd_roots, flows=flows, flow_ph="s")
        bwd = _block([], bwd_roots, flows=flows, flow_ph="f")
        target *= (budget - opt_events) / m / (fwd.n_events + bwd.n_events)
    stage_params = cfg.n_params() // pp
    bucket_nelems = [stage_params // BUCKETS + (1 if i < stage_params % BUCKETS else 0)
                     for i in range(BUCKETS)]
    calls = []
    if dp > 1:   # each bucket's all-reduce is enqueued once its gradients are ready
        # Its weight among the roots: about CALL_US of the backward's compute time.
        weight = CALL_US / (bwd.n_events * US_PER_EVENT) * sum(r.weight for r in bwd_roots)
        for i, n in enumerate(bucket_nelems):
            where = int(len(bwd_roots) * (i + 1) / (BUCKETS + 0.25))
            calls.append((where, Op("c10d::allreduce_", _args(
                ["TensorList", "", "", "", "Scalar", "Scalar"], [[[n]], [], [], [], [], []],
                ["", "", "", "", "True", "-1"]), weight)))
    bwd_last = _block([], bwd_roots, flows=flows, flow_ph="f", slots=tuple(calls))
    opt = _block(["Optimizer.step#AdamW.step"], _fill(_optimizer_ops(dim, ffn), opt_events))
    run_id = f"{seed:04x}{ranks:04x}{events_per_step:04x}"[-12:].rjust(12, "0")
    return Plan(lay, _groups(lay), steps, m, fwd, bwd, bwd_last, opt, bucket_nelems,
                [rows, seq, dim], slow_rank, slow_ms * 1000.0, seed, run_id)


def _one_f_one_b(stage: int, stages: int, m: int) -> list[tuple[str, int]]:
    """torch.distributed.pipelining's 1F1B order on one stage: stages − 1 − stage warm-up
    forwards, then a forward and a backward in turn, then the remaining backwards."""
    warm = min(stages - 1 - stage, m)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    return order + [("B", i) for i in range(b, m)]


def _xfer_us(nbytes: float, factor: float = 1.0) -> float:
    """How long moving ``nbytes`` takes (``factor``: the all-reduce's 2(n−1)/n)."""
    return LATENCY_US + factor * nbytes / BANDWIDTH_BYTES_PER_US


SETUP_COLLECTIVES = (  # DDP's construction, before the first step: (op, in, out, dtype)
    ("all_gather", [[1]], None, "Long"),         # _verify_param_shape_across_processes
    ("broadcast", [[68]], [[68]], "Long"),
    ("broadcast", None, None, "Float"),          # the parameters, one coalesced bucket
    ("broadcast", [[1]], [[1]], "Long"),
)


class _Meetings:
    """The meeting points: collectives by (group, sequence number), point-to-point transfers
    by (op, rank, peer, tag). A collective ends on every rank ``_xfer_us`` after its last
    arrival and the group's previous collective; a transfer ``_xfer_us`` after the later of
    its two posts."""

    def __init__(self, groups: list[Group]):
        self.size = {g.name: len(g.ranks) for g in groups}
        self.arrivals: dict[tuple[str, int], dict[int, float]] = collections.defaultdict(dict)
        self.ends: dict[tuple[str, int], float] = {}
        self.posts: dict[tuple, float] = {}

    def post(self, req) -> None:
        if req[0] == "post":
            _, group, seq, rank, t = req
            self.arrivals[(group, seq)][rank] = t
        else:
            _, op, rank, peer, tag, t = req
            self.posts[(op, rank, peer, tag)] = t

    def answer(self, req) -> float | None:
        """When the awaited operation ends, or None while a peer has not reached it."""
        if req[0] == "wait":
            _, group, seq, nbytes = req
            key = (group, seq)
            if key not in self.ends:
                arrived, n = self.arrivals[key], self.size[group]
                if len(arrived) < n:
                    return None
                prev = self.ends.get((group, seq - 1), -math.inf)
                self.ends[key] = max(max(arrived.values()), prev) + \
                    _xfer_us(nbytes, 2 * (n - 1) / n)
            return self.ends[key]
        _, op, rank, peer, tag, nbytes = req
        other = self.posts.get(("recv" if op == "send" else "send", peer, rank, tag))
        if other is None:
            return None
        return max(self.posts[(op, rank, peer, tag)], other) + _xfer_us(nbytes)


def _program(plan: Plan, rank: int, rng: np.random.Generator, out: dict):
    """Rank ``rank``'s run as a generator of requests to the simulation — ("post", …) and
    ("p2p_post", …) never block, ("wait", …) and ("p2p_wait", …) are answered with the time
    the operation ends — recording in ``out`` what its trace ("main": the main thread's ranges
    and blocks in order, "gloo": the worker threads' all-reduces), step timer ("steps") and
    Flight Recorder ("fr") need."""
    lay, m = plan.lay, plan.microbatches
    stage, stages = lay.coordinates(rank)["pp"], lay.size("pp")
    dp_group = _group_of(plan.groups, rank, "dp")
    pp_group = _group_of(plan.groups, rank, "pp")
    ddp = len(dp_group.ranks) > 1
    act_bytes = math.prod(plan.act_shape) * 4
    main, gloo, steps, fr = out["main"], out["gloo"], out["steps"], out["fr"]
    seq = 0
    if ddp:
        params = sum(plan.bucket_nelems)
        for k, (op, ins, outs, dtype) in enumerate(SETUP_COLLECTIVES):
            seq += 1
            ins = ins or [[params]]
            outs = outs or ([[len(dp_group.ranks), 1]] if op == "all_gather" else ins)
            fr.append((dp_group, seq, op, ins, outs, dtype, -50_000.0 + 1_000.0 * k))
    order = _one_f_one_b(stage, stages, m) if stages > 1 else \
        [x for i in range(m) for x in (("F", i), ("B", i))]
    base = {"F": plan.fwd.n_events * US_PER_EVENT, "B": plan.bwd.n_events * US_PER_EVENT}
    t = 0.0
    for step in range(plan.total_steps):
        profiled = step >= WARMUP_STEPS
        warm = WARMUP_SLOWDOWN[step] if step < WARMUP_STEPS else 1.0
        work = {a: base[a[0]] * warm * float(rng.lognormal(0.0, NOISE)) for a in order}
        if rank == plan.slow_rank and plan.slow_us > 0:
            total = sum(work.values())
            work = {a: w + plan.slow_us * w / total for a, w in work.items()}
        step_t0 = t
        rec: list = []
        t += float(rng.uniform(*HOST_GAP_US))
        zero_grad = (t, 30.0 + float(rng.uniform(0.0, 60.0)))
        t += zero_grad[1] + float(rng.uniform(*HOST_GAP_US))
        pipe_t0 = t
        sends: list[tuple] = []
        for kind, i in order:
            recvs = []
            if kind == "F" and stage > 0:
                recvs.append(("recv", pp_group.ranks[stage - 1], (step, "act", i)))
            if kind == "B" and stage < stages - 1:
                recvs.append(("recv", pp_group.ranks[stage + 1], (step, "grad", i)))
            if sends or recvs:
                t = yield from _p2p_batch(rank, sends + recvs, t, act_bytes, pp_group, rec)
            sends = []
            t += float(rng.uniform(*HOST_GAP_US))
            dur = work[(kind, i)]
            block = plan.fwd if kind == "F" else plan.bwd
            end = t + dur
            if kind == "B" and i == m - 1 and ddp:
                block = plan.bwd_last
                posted = []
                for b, (rel, n) in enumerate(zip(block.slots, plan.bucket_nelems)):
                    seq += 1
                    arrival = t + rel * dur
                    posted.append((seq, arrival, n, b))
                    yield ("post", dp_group.name, seq, rank, arrival)
                    fr.append((dp_group, seq, "all_reduce", [[n]], [[n]], "Float", arrival))
                done = -math.inf
                for s, arrival, n, b in posted:   # DDP waits for every bucket at the end
                    coll_end = yield ("wait", dp_group.name, s, n * 4)
                    if profiled:
                        gloo.append((b % 2, max(arrival + CALL_US, done) + 5.0, coll_end, n))
                    done = coll_end
                end = max(end, done + 20.0)
            name = microbatch("forward" if kind == "F" else "backward", stage, 0, i)
            rec.append(("block", block, name, t, dur, end - t, step, i))
            t = end
            if kind == "F" and stage < stages - 1:
                sends.append(("send", pp_group.ranks[stage + 1], (step, "act", i)))
            if kind == "B" and stage > 0:
                sends.append(("send", pp_group.ranks[stage - 1], (step, "grad", i)))
        if sends:
            t = yield from _p2p_batch(rank, sends, t, act_bytes, pp_group, rec)
        pipe_t1 = t + 10.0
        t = pipe_t1 + float(rng.uniform(*HOST_GAP_US))
        opt_dur = plan.opt.n_events * US_PER_EVENT * float(rng.lognormal(0.0, NOISE))
        rec.append(("block", plan.opt, OPTIMIZER, t, opt_dur, opt_dur, step, -1))
        t += opt_dur
        if profiled:
            main.append(("range", f"ProfilerStep#{step}", step_t0, t + 15.0 - step_t0))
            main.append(("range", "Optimizer.zero_grad#AdamW.zero_grad", *zero_grad))
            main.append(("range", PIPELINE, pipe_t0, pipe_t1 - pipe_t0))
            main.extend(rec)
        steps.append((step, step_t0, t - step_t0, pipe_t1 - pipe_t0, opt_dur))
        t += 15.0 + float(rng.uniform(*HOST_GAP_US))
    out["end_us"] = t


def _p2p_batch(rank: int, batch: list[tuple], t: float, nbytes: int, pp_group: Group,
               rec: list):
    """Post a batch of sends and receives at ``t`` (a ``c10d::send`` / ``c10d::recv_`` call
    each), then wait for each in turn; returns when the last wait returns. Records the calls
    and the ``gloo:send`` / ``gloo:recv`` spans that cover the waits."""
    calls = []
    for j, (op, peer, tag) in enumerate(batch):
        call_t = t + j * (CALL_US + 5.0)
        yield ("p2p_post", op, rank, peer, tag, call_t)
        calls.append((op, peer, call_t))
    start = calls[0][2] + CALL_US - 3.0           # the first wait begins inside the calls
    calls_end = calls[-1][2] + CALL_US + 5.0
    spans = []
    for op, peer, tag in batch:
        end = yield ("p2p_wait", op, rank, peer, tag, nbytes)
        stop = max(end, start + 10.0, calls_end if not spans else start + 10.0)
        spans.append((op, start, stop))
        start = stop + 5.0
    local = {r: i for i, r in enumerate(pp_group.ranks)}
    rec.append(("p2p", [(op, local[peer], ct) for op, peer, ct in calls], spans))
    return start + 10.0


def _simulate(plan: Plan) -> list[dict]:
    """Run every rank's program to its end; returns what each recorded."""
    ranks = plan.lay.world_size
    meet = _Meetings(plan.groups)
    outs = [{"main": [], "gloo": [], "steps": [], "fr": []} for _ in range(ranks)]
    gens = [_program(plan, r, np.random.default_rng([plan.seed, r]), outs[r])
            for r in range(ranks)]
    waiting: list = [next(g) for g in gens]   # each program's first request
    active = list(range(ranks))
    while active:
        progressed, still = False, []
        for r in active:
            req = waiting[r]
            while req is not None:
                if req[0] in ("post", "p2p_post"):
                    meet.post(req)
                    answer = 0.0
                else:
                    answer = meet.answer(req)
                    if answer is None:
                        break
                progressed = True
                try:
                    req = gens[r].send(answer)
                except StopIteration:
                    req = None
            waiting[r] = req
            if req is not None:
                still.append(r)
        if still and not progressed:
            raise RuntimeError(f"the synthetic schedule deadlocked (ranks {still[:8]}): a bug "
                               f"in bench/synth.py")
        active = still
    return outs


# -- writing the run directory ---------------------------------------------------------------

def _pid(rank: int) -> tuple[int, int, int, int]:
    """Process id and thread ids of a rank: the main thread (its id is the process's), two
    gloo worker threads."""
    pid = 20_000 + 8 * rank
    return pid, pid, pid + 3, pid + 4


def _meta_event(name: str, pid, tid, ts: float, args: dict) -> str:
    return (f'  {{\n    "ph": "M",\n    "name": "{name}",\n    "ts": {ts:.3f},\n'
            f'    "pid": {pid},\n    "tid": {tid},\n    "args": {json.dumps(args)}\n  }},\n')


def _trace_header(plan: Plan, rank: int) -> str:
    lay = plan.lay
    info = {"backend": "gloo", "rank": rank, "world_size": lay.world_size,
            "pg_count": len(plan.groups),
            "pg_config": [{"pg_name": g.name, "pg_desc": g.desc,
                           "backend_config": "cpu:gloo,cuda:gloo", "pg_size": len(g.ranks),
                           "ranks": list(g.ranks)} for g in _rank_groups(plan.groups, rank)]}
    meta = {"layout": str(lay), "rank": rank, "coordinates": lay.coordinates(rank),
            "run_id": plan.run_id}
    return ('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n  \n'
            f'    "trace_id": "{(plan.run_id + format(rank, "020X")).upper()}",\n'
            '    "record_shapes": 1,\n'
            f'    "distributedInfo": {json.dumps(info)},\n'
            f'    "meshscope": {json.dumps(meta)},\n'
            '    "host_name": "synth",\n  "displayTimeUnit": "ms",\n'
            f'  "baseTimeNanoseconds": {EPOCH_NS},\n  "traceEvents": [\n  \n')


def trace_text(plan: Plan, rank: int, rec: dict) -> str:
    """The Kineto JSON text of ``rank``'s trace from what its program recorded."""
    pid, main_tid, *gloo_tids = _pid(rank)
    parts = [_trace_header(plan, rank)]
    first = T0_US + rec["main"][0][2]
    parts += [_meta_event("process_name", pid, 0, first, {"name": "python3"}),
              _meta_event("process_labels", pid, 0, first, {"labels": "CPU"}),
              _meta_event("process_sort_index", pid, 0, first, {"sort_index": pid})]
    for tid in (*gloo_tids, main_tid):
        label = "python3" if tid == main_tid else "pt_gloo_runloop"
        parts += [_meta_event("thread_name", pid, tid, first, {"name": f"thread {tid} ({label})"}),
                  _meta_event("thread_sort_index", pid, tid, first, {"sort_index": tid})]
    ext = 1
    for item in rec["main"]:
        if item[0] == "range":
            _, name, ts, dur = item
            parts.append(x_event(name, "user_annotation", pid, main_tid, T0_US + ts, dur, ext))
            ext += 1
        elif item[0] == "block":
            _, block, name, ts, compute, total, step, mb = item
            parts.append(x_event(name, "user_annotation", pid, main_tid, T0_US + ts, total, ext))
            ext += 1
            # A microbatch's backward ends the flows its forward started: the same ids.
            first_flow = 1 + (step * plan.microbatches + max(mb, 0)) * block.n_flow
            parts.append(_render(block, pid, main_tid, T0_US + ts, compute, ext, first_flow))
            ext += len(block.rel_ts)
        else:  # a point-to-point batch: the c10d calls, then the gloo spans that wait
            _, calls, spans = item
            shape = plan.act_shape
            for op, local_peer, ts in calls:
                args = _args(["TensorList", "", "Scalar", "Scalar"], [[shape], [], [], []],
                             ["", "", str(local_peer), "0"], seq=2749)
                parts.append(x_event("c10d::send" if op == "send" else "c10d::recv_", "cpu_op",
                                     pid, main_tid, T0_US + ts, CALL_US, ext, args))
                ext += 1
            for op, start, stop in spans:
                parts.append(x_event(f"gloo:{op}", "user_annotation", pid, main_tid,
                                     T0_US + start, stop - start, ext, _args(["float"], [shape])))
                ext += 1
    for thread, start, stop, n in rec["gloo"]:
        parts.append(x_event("gloo:all_reduce", "user_annotation", pid, gloo_tids[thread],
                             T0_US + start, stop - start, ext, _args(["float"], [[n]])))
        ext += 1
    begin, end = first - 120.0, T0_US + rec["end_us"]
    parts.append('  {\n    "ph": "X",\n    "cat": "Trace",\n    "name": "PyTorch Profiler (0)",'
                 '\n    "pid": "Spans",\n    "tid": "PyTorch Profiler",\n'
                 f'    "ts": {begin:.3f},\n    "dur": {end - begin:.3f}\n    ,\n'
                 '    "args": {\n      "Op count": 0\n    }\n  },\n')
    parts.append(_meta_event("process_sort_index", '"Spans"', 0, begin, {"sort_index": 536870912}))
    parts.append('  {\n    "ph": "i",\n    \n    "s": "g",\n'
                 '    "name": "Iteration Start: PyTorch Profiler",\n    "pid": "Traces",\n'
                 f'    "tid": "Trace PyTorch Profiler",\n    "ts": {begin:.3f}\n    \n  }},\n')
    parts.append('  {\n    "ph": "i",\n    \n    "s": "g",\n    "name": "Record Window End",\n'
                 f'    "pid": "",\n    "tid": "",\n    "ts": {end + 50.0:.3f}\n    \n  }}\n'
                 f'  ],"traceName": "/tmp/synth-rank{rank}.json" }}\n')
    return "".join(parts)


def _unix_ns(t_us: float) -> int:
    """A simulation time (µs) as Unix ns, on the clock of ``baseTimeNanoseconds``."""
    return EPOCH_NS + int(round((T0_US + t_us) * 1000.0))


def _iso(t_us: float) -> str:
    return dt.datetime.fromtimestamp(_unix_ns(t_us) / 1e9, dt.timezone.utc).isoformat(
        timespec="seconds")


def _timer_steps(rec_steps: list, timer_steps: int | None) -> list:
    """The simulated steps, then (``timer_steps`` in all) those of a run that went on after its
    profiled steps: each the last one again, started when the one before it ended, its times
    scaled by the same seeded noise on every rank (a step takes its slowest rank's time)."""
    steps = list(rec_steps)
    step, t0, wall, fwd_bwd, opt = steps[-1]
    noise = np.random.default_rng([0, 2]).lognormal(0.0, NOISE, max(0, (timer_steps or 0)
                                                                      - len(steps)))
    for f in noise.tolist():
        t0, step = t0 + wall, step + 1
        steps.append((step, t0, wall * f, fwd_bwd * f, opt * f))
    return steps


def _steps_table(plan: Plan, rank: int, rec: dict, timer_steps: int | None = None) -> pa.Table:
    """The step timers of ``rank`` (collectors/step_timer.py's columns), for ``timer_steps``
    steps (``_timer_steps``; default: the simulated ones)."""
    lay = plan.lay
    last_stage = lay.coordinates(rank)["pp"] == lay.size("pp") - 1
    cfg = PRESETS[MODEL]
    tokens = plan.microbatches * MICROBATCH_ROWS * cfg.seq_len
    rng = np.random.default_rng([plan.seed, rank, 1])
    rows = []
    for step, t0, wall, fwd_bwd, opt in _timer_steps(rec["steps"], timer_steps):
        settled = min(step, plan.total_steps)       # loss and memory level off after the run
        loss = 5.75 - 0.03 * settled + float(rng.normal(0.0, 0.01)) if last_stage else math.nan
        rows.append({"rank": rank, "step": step, "start_unix_s": _unix_ns(t0) / 1e9,
                     "wall_time_us": wall, "fwd_bwd_us": fwd_bwd, "optimizer_us": opt,
                     "tokens": tokens, "loss": loss,
                     "peak_memory_bytes": 360_000_000 + 4_000_000 * settled})
    return pa.Table.from_pylist(rows, schema=STEP_SCHEMA)


def _earlier(rec_fr: list, fr_entries: int | None) -> tuple[list, dict[str, int]]:
    """A buffer of ``fr_entries`` entries (None: the run's own): the run's collectives kept as
    the newest, preceded by all-reduces of a longer job's earlier steps (the first group's
    first all-reduce repeated, created an hour before the run); every group's sequence numbers
    start after its earlier entries, the same on every rank of the group."""
    extra = max(0, (fr_entries or 0) - len(rec_fr))
    if not extra or not rec_fr:
        return rec_fr, {}
    ar = next((x for x in rec_fr if x[2] == "all_reduce"), rec_fr[0])
    group, _, op, ins, outs, dtype, _ = ar
    first_t = min(x[6] for x in rec_fr) - 3_600e6
    head = [(group, k + 1, op, ins, outs, dtype, first_t + 1_000.0 * k) for k in range(extra)]
    return head + rec_fr, {group.name: extra}


def _dump(plan: Plan, rank: int, rec: dict, fr_entries: int | None = None) -> dict:
    """The Flight Recorder dump of ``rank`` (collectors/flight_recorder.py's envelope around
    PyTorch's own JSON), as gloo leaves it: no start or completion times. ``fr_entries``: the
    buffer's length (``_earlier``)."""
    pg_id = {g.name: i for i, g in enumerate(_rank_groups(plan.groups, rank))}
    entries, last = [], {}
    recs, shift = _earlier(rec["fr"], fr_entries)
    for record_id, (group, seq, op, ins, outs, dtype, t) in enumerate(recs):
        if record_id >= len(recs) - len(rec["fr"]):
            seq += shift.get(group.name, 0)
        entries.append({
            "collective_seq_id": seq, "input_dtypes": [dtype] * len(ins), "input_sizes": ins,
            "is_p2p": False, "op_id": seq, "output_dtypes": [dtype] * len(outs),
            "output_sizes": outs, "p2p_seq_id": 0, "pg_id": pg_id[group.name],
            "process_group": [group.name, group.desc], "profiling_name": f"gloo:{op}",
            "record_id": record_id, "retired": True, "state": "scheduled",
            "thread_id": str(140_000_000_000_000 + rank), "thread_name": "python3",
            "time_created_ns": _unix_ns(t + 3.0), "time_discovered_completed_ns": None,
            "time_discovered_started_ns": None, "timeout_ms": 300000})
        last[pg_id[group.name]] = seq
    return {"schema_version": flight_recorder.FR_SCHEMA_VERSION, "rank": rank, "reason": "end",
            "error": None, "dumped_at_unix_s": _unix_ns(rec["end_us"]) / 1e9 + 0.5,
            "torch_version": "2.13.0+cpu",
            "flight_recorder": {
                "comm_lib_version": "", "entries": entries, "nccl_comm_state": {},
                "pg_config": {"": {"desc": "", "name": "", "ranks": "[]"}},
                "pg_status": {str(i): {"last_completed_collective": str(s),
                                       "last_enqueued_collective": str(s),
                                       "last_started_collective": "-1"}
                              for i, s in last.items()},
                "version": "2.10"}}


def _run_json(plan: Plan, outs: list[dict], events_per_step: int) -> dict:
    lay, cfg = plan.lay, PRESETS[MODEL]
    pp = lay.size("pp")
    first = min(o["steps"][0][1] for o in outs)
    last = max(o["end_us"] for o in outs)
    return {
        "schema_version": rd.RUN_SCHEMA_VERSION, "run_id": plan.run_id, "status": "completed",
        "layout": {d: lay.size(d) for d in PARALLEL_DIMS},
        "layout_str": str(lay), "world_size": lay.world_size,
        "mesh": {"dims": list(lay.mesh_dims), "shape": [lay.size(d) for d in lay.mesh_dims],
                 "coordinates": {str(r): lay.coordinates(r) for r in range(lay.world_size)}},
        "process_groups": [{"dimension": g.dim, "ranks": list(g.ranks), "name": g.name,
                            "desc": g.desc} for g in plan.groups if g.dim != "world"],
        "schedule": "1f1b" if pp > 1 else None,
        "pipeline": {"stages": pp, "virtual_stages": 1, "microbatches": plan.microbatches,
                     "stage_layers": stage_layers(cfg.n_layers, pp)},
        "dp_mode": "ddp", "sequence_parallel": None, "faults": [], "nnodes": 1,
        "microbatches": plan.microbatches,
        "global_batch": plan.microbatches * MICROBATCH_ROWS * lay.size("dp"),
        "steps": plan.total_steps, "profile_steps": [WARMUP_STEPS, plan.total_steps - 1],
        "seed": plan.seed, "lr": 1e-3,
        "model": {"preset": MODEL, **dataclasses.asdict(cfg), "n_params": cfg.n_params(),
                  "flops_per_token": cfg.flops_per_token()},
        "device": {"type": "cpu", "name": "x86_64", "backend": "gloo", "peak_flops": None,
                   "memory_bandwidth_bytes_per_s": None, "peak_source": None},
        "versions": {"python": platform.python_version(), "torch": "2.13.0+cpu",
                     "meshscope": "synthetic"},
        "command": ["python", "-m", "bench.synth"],
        "start_time": _iso(first), "end_time": _iso(last),
        # Not the runner's: how this directory was made, and what to expect of it.
        "synthetic": {"generator": "bench/synth.py", "events_per_step": events_per_step,
                      "slow_rank": plan.slow_rank, "slow_ms": plan.slow_us / 1000.0,
                      "seed": plan.seed},
    }


_WORK: tuple | None = None   # (plan, outs, out dir) for the forked writer processes


def _write_rank(rank: int) -> int:
    """Write ``rank``'s trace, step timers and dump; returns the trace's event count."""
    from isal import igzip

    plan, outs, out, fr_entries, timer_steps = _WORK
    rec = outs[rank]
    text = trace_text(plan, rank, rec).encode()
    rd.trace_path(out, rank).write_bytes(igzip.compress(text, compresslevel=1, mtime=0))
    pq.write_table(_steps_table(plan, rank, rec, timer_steps), rd.steps_path(out, rank))
    rd.write_json_atomic(rd.comms_path(out, rank),
                         _dump(plan, rank, rec, fr_entries))
    return text.count(b'"ph": ') - text.count(b'"ph": "M"')


def make_run(out: pathlib.Path, *, ranks: int, steps: int = 3, events_per_step: int = 2000,
             layout: str | None = None, slow_rank: int | None = None, slow_ms: float = 0.0,
             seed: int = 0, microbatches: int | None = None, workers: int | None = None,
             fr_entries: int | None = None, timer_steps: int | None = None) -> pathlib.Path:
    """Write a synthetic run directory at ``out`` (which must not exist or be empty); returns
    it. ``layout``: ``dp=N`` (the default: dp = ranks) or ``dp=A,pp=B``; ``steps``: profiled
    steps (the step timers also hold ``WARMUP_STEPS`` before them); ``events_per_step``: about
    how many trace events each rank has per profiled step; ``slow_rank`` computes ``slow_ms``
    longer per step than its peers; ``microbatches``: default max(4, pp); ``workers``: writer
    processes (default: the CPU count); ``fr_entries``: Flight Recorder entries per rank, as
    the buffer of a longer job holds them (default: the run's own collectives, a few dozen);
    ``timer_steps``: steps in the step timers, as if the run went on after its profiled steps
    (default: the simulated ones; run.json's ``steps`` says as many)."""
    global _WORK
    out = pathlib.Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    plan = _plan(ranks, steps, events_per_step, layout, slow_rank, slow_ms, seed, microbatches)
    outs = _simulate(plan)
    for sub in (rd.TRACES, rd.STEPS, rd.COMMS):
        (out / sub).mkdir(parents=True, exist_ok=True)
    _WORK = (plan, outs, out, fr_entries, timer_steps)
    pa.array([0])  # pyarrow imports pandas at its first array: once here, not in every worker
    try:
        n = max(1, min(workers or os.cpu_count() or 1, ranks))
        if n == 1 or "fork" not in mp.get_all_start_methods():
            counts = [_write_rank(r) for r in range(ranks)]
        else:
            with mp.get_context("fork").Pool(n) as pool:
                counts = pool.map(_write_rank, range(ranks), chunksize=max(1, ranks // (4 * n)))
    finally:
        _WORK = None
    desc = _run_json(plan, outs, events_per_step)
    desc["steps"] = max(desc["steps"], timer_steps or 0)
    desc["synthetic"]["trace_events_per_step"] = round(sum(counts) / ranks / steps)
    rd.write_json_atomic(out / rd.RUN_JSON, desc)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.synth",
                                 description="Write a synthetic run directory (bench/synth.py).")
    ap.add_argument("out", type=pathlib.Path, help="run directory to create")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    ap.add_argument("--events-per-step", type=int, default=2000,
                    help="trace events per rank and profiled step (default 2000)")
    ap.add_argument("--layout", default=None, help="dp=N (default: dp = ranks) or dp=A,pp=B")
    ap.add_argument("--slow-rank", type=int, default=None)
    ap.add_argument("--slow-ms", type=float, default=0.0,
                    help="extra compute of --slow-rank per step, ms")
    ap.add_argument("--microbatches", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=None, help="writer processes")
    ap.add_argument("--fr-entries", type=int, default=None,
                    help="Flight Recorder entries per rank (default: the run's own collectives)")
    ap.add_argument("--timer-steps", type=int, default=None,
                    help="steps in the step timers, as if the run went on after its profiled "
                         "steps (default: the simulated ones)")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    a = ap.parse_args(argv)
    if a.force and a.out.exists():
        shutil.rmtree(a.out)
    t0 = time.perf_counter()
    try:
        make_run(a.out, ranks=a.ranks, steps=a.steps, events_per_step=a.events_per_step,
                 layout=a.layout, slow_rank=a.slow_rank, slow_ms=a.slow_ms, seed=a.seed,
                 microbatches=a.microbatches, workers=a.workers, fr_entries=a.fr_entries,
                 timer_steps=a.timer_steps)
    except (ValueError, FileExistsError) as e:
        print(f"bench.synth: error: {e}", file=sys.stderr)
        raise SystemExit(2)
    info = json.loads((a.out / rd.RUN_JSON).read_text())["synthetic"]
    size = sum(f.stat().st_size for f in (a.out / rd.TRACES).iterdir())
    print(f"{a.out}: {a.ranks} ranks, {info['trace_events_per_step']} events per rank and "
          f"step, {size / 2**20:.1f} MB of traces, {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
