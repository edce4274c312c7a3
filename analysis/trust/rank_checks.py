"""The checks of one rank's trace, made where its event table is (``report/rank_work.py``).

Every check counts one kind of damage and grades it against two thresholds (a share of what
it counts, or of the rank's step time): at or below the first it passes, above it the rank's
numbers are *usable with caveats*, above the second they are *not trustworthy*.
docs/metrics.md ("Trust") gives each threshold and why; ``analysis/report/trust_verdict.py`` what
each failed check affects.

- ``bad-durations`` — events ingest dropped for an impossible time: a negative or non-finite
  duration, a start far outside the trace, a duration longer than the trace
  (``ingest/validate.py``). Any is a caveat (the timeline has holes where they were); over
  ``BAD_SHARE_PCT`` of the events, not trustworthy.
- ``zero-durations`` — device activity of zero length: the trace rounds to whole µs, so each
  hides up to ``RESOLUTION_US``. A caveat when that could exceed ``ZERO_SHARE_PCT`` of the
  device's busy time, not trustworthy over ``ZERO_UNTRUSTED_PCT``.
- ``over-long`` — an event that starts inside a profiled step and lasts longer than the whole
  step, past its end (the profiler's own frames aside: its ``step()`` collects the trace) (an operator of 30 s in a 50 ms step): what it overlaps after the step
  reads as busy. Any is a caveat; an excess over ``OVER_LONG_UNTRUSTED_PCT`` of the profiled
  time, not trustworthy.
- ``launch-skew`` — device activity that starts more than ``SKEW_TOLERANCE_US`` before the
  call that launched it started: the host's and CUPTI's clocks disagree (Kineto's known skew
  in tight NCCL bursts). Counted per stream and kind, with the largest lead. Any is a caveat;
  over ``SKEW_UNTRUSTED_PCT`` of the launched activity, not trustworthy.
- ``stream-overlap`` — activity on one stream that starts before the previous ends (a stream
  runs its work in order) by more than ``SKEW_TOLERANCE_US``. Over ``OVERLAP_SHARE_PCT`` of
  the device's busy time a caveat, over ``OVERLAP_UNTRUSTED_PCT`` not trustworthy.
- ``dropped-activity`` — a kernel launch whose kernel never appears although later device
  activity was recorded, and device activity without its launch after its stream's first
  launched activity (the profiler lost one side: a full activity buffer, a subsampled trace).
  Any is a caveat; over ``DROPPED_UNTRUSTED_PCT`` of the launches, not trustworthy.
- ``cut-short`` — the trace ends inside its last profiled step (no event starts in the last
  ``CUT_TAIL_SHARE`` of it, nor after it), or the device's activity stops while the host goes on launching
  for more than ``BUFFER_GAP_US`` (the profiler's activity buffer filled). A caveat on that
  step; not trustworthy when it is the rank's only step.
- ``timestamp-precision`` — times so large that float64 cannot hold them to the µs: at
  ``PRECISION_UNTRUSTED_US`` or coarser every duration is rounded to that step, not
  trustworthy; above ``PRECISION_CAVEAT_US``, a caveat.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from meshscope.analysis.gpu import host_activity
from meshscope.analysis.ingest.event_table import names_where
from meshscope.analysis.ingest.validate import DROPPED, Damage
from meshscope.analysis.trust.measured import Measured, graded, pct
from meshscope.vocabulary import TrustCheckId as C

BAD_SHARE_PCT = 1.0
RESOLUTION_US = 1.0
ZERO_SHARE_PCT = 1.0
ZERO_UNTRUSTED_PCT = 10.0
OVER_LONG_UNTRUSTED_PCT = 10.0
SKEW_TOLERANCE_US = 1.0
SKEW_UNTRUSTED_PCT = 10.0
OVERLAP_SHARE_PCT = 1.0
OVERLAP_UNTRUSTED_PCT = 10.0
DROPPED_UNTRUSTED_PCT = 5.0
CUT_TAIL_SHARE = 0.5
BUFFER_GAP_US = 1_000.0
PRECISION_CAVEAT_US = 0.25
PRECISION_UNTRUSTED_US = 1.0

#: Host calls that launch a kernel (or a graph of them): each must have device activity.
KERNEL_LAUNCH_RE = re.compile(r"Launch(?:Cooperative)?Kernel|GraphLaunch|^cuLaunch|"
                              r"^hip(?:Ext)?(?:Module)?Launch")
#: Ranges that enclose steps rather than sit inside them, and the profiler's own frames (its
#: ``step()`` call collects the trace at the end of the last step and lasts as long as that).
_ENCLOSING_RE = re.compile(r"^ProfilerStep#\d+$|^torch/profiler/|^\[?PyTorch Profiler")
_DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
_COLUMNS = ["name", "cat", "ts_us", "dur_us", "end_us", "lane", "device", "correlation"]


def rank_checks(rank: int, events: pd.DataFrame, damage: Damage,
                host_steps: dict[int, tuple[float, float]]) -> list[Measured]:
    """Every check of one rank's trace (module docstring), passed or not; ``host_steps``: its
    profiled steps' host windows (µs)."""
    events = events[_COLUMNS]           # the few columns read: each selection copies less
    dev_mask = events["device"].to_numpy()
    dev = events[dev_mask & events["cat"].isin(_DEVICE_KINDS).to_numpy()]
    host = events[~dev_mask]
    checks = [_bad_durations(rank, damage, len(events)),
              _over_long(rank, events, host_steps),
              _cut_short(rank, events, dev, host, host_steps),
              _precision(rank, events)]
    if len(dev):
        launches = host_activity.runtime_calls(host).drop_duplicates("correlation")
        checks += [_zero(rank, dev), _skew(rank, dev, launches), _overlap(rank, dev),
                   _dropped(rank, dev, launches)]
    return checks


def _bad_durations(rank: int, damage: Damage, kept: int) -> Measured:
    bad = {(f, w): n for (f, a, w), n in damage.items() if a == DROPPED and f in ("ts", "dur")}
    n = sum(bad.values())
    total = kept + damage.dropped
    share = pct(n, total) or 0.0
    sev = "untrustworthy" if share > BAD_SHARE_PCT else "caveat" if n else None
    why = "; ".join(f"{k} {w}" for (f, w), k in sorted(bad.items(), key=lambda x: -x[1]))
    return Measured(C.BAD_DURATIONS, sev, (rank,), n, total, None, share,
                    text=f"rank {rank}: {n:,} of {total:,} events dropped for an impossible "
                         f"time ({why}): the timeline has holes where they were" if n else "")


def _zero(rank: int, dev: pd.DataFrame) -> Measured:
    dur = dev["dur_us"].to_numpy()
    n = int((dur <= 0).sum())
    busy = float(dur.sum())
    share = pct(n * RESOLUTION_US, busy) or 0.0
    sev = graded(share, ZERO_SHARE_PCT, ZERO_UNTRUSTED_PCT) if n else None
    return Measured(C.ZERO_DURATIONS, sev, (rank,), n, len(dev), n * RESOLUTION_US, share,
                    text=f"rank {rank}: {n:,} of {len(dev):,} device events last 0 µs: the "
                         f"trace rounds to whole µs, so up to {n * RESOLUTION_US:,.0f} µs "
                         f"({share:.1f}% of the device's busy time) is not seen" if n else "")


def _in_step(ts: np.ndarray, host_steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per time: its step's number, start and end (-1 / NaN outside every step)."""
    step = np.full(len(ts), -1, dtype=np.int64)
    lo, hi = np.full(len(ts), np.nan), np.full(len(ts), np.nan)
    for k, (a, b) in host_steps.items():
        m = (ts >= a) & (ts < b)
        step[m], lo[m], hi[m] = k, a, b
    return step, lo, hi


def _over_long(rank: int, events: pd.DataFrame, host_steps) -> Measured:
    ts, end = events["ts_us"].to_numpy(), events["end_us"].to_numpy()
    step, lo, hi = _in_step(ts, host_steps)
    inside = step >= 0
    long_ = inside & (end - ts > hi - lo) & (end > hi)
    if long_.any():
        long_ &= ~names_where(events["name"], _ENCLOSING_RE.match)
    n = int(long_.sum())
    profiled = float(sum(b - a for a, b in host_steps.values()))
    excess = float((end[long_] - hi[long_]).sum()) if n else 0.0
    share = pct(excess, profiled) or 0.0
    sev = ("untrustworthy" if share > OVER_LONG_UNTRUSTED_PCT else "caveat") if n else None
    text = ""
    if n:
        i = int(np.argmax(np.where(long_, end - ts, -np.inf)))
        text = (f"rank {rank}: {n:,} event{'s' * (n != 1)} "
                f"{'last' if n != 1 else 'lasts'} longer than the step "
                f"{'they start' if n != 1 else 'it starts'} in — the longest, {events['name'].iloc[i]!s:.60} in step {step[i]}, "
                f"lasts {(end[i] - ts[i]) / 1e3:,.1f} ms in a {(hi[i] - lo[i]) / 1e3:,.1f} ms "
                f"step; {excess / 1e3:,.1f} ms past {'their steps' if n != 1 else 'its step'}' "
                f"end{'s' * (n != 1)} ({share:.0f}% of the profiled time) read as busy")
    return Measured(C.OVER_LONG, sev, (rank,), n, int(inside.sum()), excess or None, share,
                    tuple(sorted({int(s) for s in step[long_]})), text)


def _skew(rank: int, dev: pd.DataFrame, launches: pd.DataFrame) -> Measured:
    start = dev["correlation"].map(launches.set_index("correlation")["ts_us"]) \
        .to_numpy(dtype=np.float64, na_value=np.nan)
    lead = start - dev["ts_us"].to_numpy()
    launched = ~np.isnan(start)
    early = launched & (lead > SKEW_TOLERANCE_US)
    n, of = int(early.sum()), int(launched.sum())
    share = pct(n, of) or 0.0
    sev = ("untrustworthy" if share > SKEW_UNTRUSTED_PCT else "caveat") if n else None
    text = ""
    if n:
        g = pd.DataFrame({"stream": dev["lane"][early].astype(str).to_numpy(),
                          "kind": dev["cat"][early].astype(str).to_numpy(),
                          "lead": lead[early]}).groupby(["stream", "kind"])["lead"] \
            .agg(["size", "max"]).sort_values("size", ascending=False)
        where = "; ".join(f"{k} on {s}: {int(r['size']):,} (up to {r['max']:,.0f} µs)"
                          for (s, k), r in g.head(3).iterrows())
        text = (f"rank {rank}: {n:,} of {of:,} launched device events start before the call "
                f"that launched them ({where}): the host's and the device's clocks disagree "
                f"by up to {lead[early].max():,.0f} µs")
    return Measured(C.LAUNCH_SKEW, sev, (rank,), n, of,
                    float(lead[early].max()) if n else None, share, text=text)


def _overlap(rank: int, dev: pd.DataFrame) -> Measured:
    n, over = 0, 0.0
    for _, g in dev.groupby("lane", observed=True, sort=False):
        g = g.sort_values("ts_us")
        s, e = g["ts_us"].to_numpy(), g["end_us"].to_numpy()
        if len(s) < 2:
            continue
        d = np.maximum.accumulate(e)[:-1] - s[1:]
        d = np.minimum(d, e[1:] - s[1:])          # no more than the later event lasts
        hit = d > SKEW_TOLERANCE_US
        n += int(hit.sum())
        over += float(d[hit].sum())
    busy = float(dev["dur_us"].sum())
    share = pct(over, busy) or 0.0
    sev = graded(share, OVERLAP_SHARE_PCT, OVERLAP_UNTRUSTED_PCT) if n else None
    return Measured(C.STREAM_OVERLAP, sev, (rank,), n, len(dev), over or None, share,
                    text=f"rank {rank}: {n:,} device events start before the previous one on "
                         f"their stream ends, {over / 1e3:,.2f} ms in all ({share:.1f}% of the "
                         f"device's busy time): a stream runs its work in order" if n else "")


def _dropped(rank: int, dev: pd.DataFrame, launches: pd.DataFrame) -> Measured:
    kernel_launches = launches[names_where(launches["name"], KERNEL_LAUNCH_RE.search)]
    last_start = float(dev["ts_us"].max())
    seen = set(dev["correlation"].tolist())
    lost = kernel_launches[(kernel_launches["ts_us"] < last_start)
                           & ~kernel_launches["correlation"].isin(seen)]
    # Device activity without its launch, after its stream's first launched activity (what
    # runs before it was launched before the profiler started).
    known = dev["correlation"].isin(set(launches["correlation"].tolist())).to_numpy()
    lanes, _ = pd.factorize(dev["lane"])        # -1: no lane, in no stream
    ts = dev["ts_us"].to_numpy()
    first = np.full(lanes.max() + 2 if len(lanes) else 1, np.inf)
    mine = known & (lanes >= 0)
    np.minimum.at(first, lanes[mine], ts[mine])
    first[-1] = np.inf
    after = ts > first[lanes]
    orphans = int((~known & after).sum())
    n = len(lost) + orphans
    of = max(len(kernel_launches), 1)
    share = pct(n, of) or 0.0
    sev = ("untrustworthy" if share > DROPPED_UNTRUSTED_PCT else "caveat") if n else None
    return Measured(C.DROPPED_ACTIVITY, sev, (rank,), n, len(kernel_launches), None, share,
                    text=f"rank {rank}: {len(lost):,} of {len(kernel_launches):,} kernel "
                         f"launches have no kernel in the trace and {orphans:,} device events "
                         f"no launch ({share:.1f}% of the launches): the profiler lost "
                         f"activity, and the device time it held is not counted" if n else "")


def _cut_short(rank: int, events: pd.DataFrame, dev: pd.DataFrame, host: pd.DataFrame,
               host_steps) -> Measured:
    if not host_steps:
        return Measured(C.CUT_SHORT, None, (rank,), 0)
    last = max(host_steps)
    a, b = host_steps[last]
    ts = events["ts_us"].to_numpy()
    inner = (ts >= a) & (ts < b)
    inner[inner] = ~names_where(events["name"][inner], _ENCLOSING_RE.match)
    latest = float(ts[inner].max()) if inner.any() else a
    tail = b - latest
    # Cut: nothing starts in the step's last part, nor after it (a trace that goes on past
    # the step was not cut inside it).
    later = ts >= b
    later[later] = ~names_where(events["name"][later], _ENCLOSING_RE.match)
    cut = tail > CUT_TAIL_SHARE * (b - a) and not later.any()
    text, gap, n_after = "", 0.0, 0
    if cut:
        text = (f"rank {rank}: the trace ends inside step {last}: nothing starts in its last "
                f"{tail / 1e3:,.1f} ms of {(b - a) / 1e3:,.1f} ms")
    elif len(dev):
        calls = host[host["correlation"] >= 0]
        kl = calls[names_where(calls["name"], KERNEL_LAUNCH_RE.search)]
        dev_end = float(dev["end_us"].max())
        after = kl["ts_us"].to_numpy() > dev_end
        n_after = int(after.sum())
        gap = float(kl["ts_us"].max()) - dev_end if n_after else 0.0
        if gap > BUFFER_GAP_US:
            cut = True
            text = (f"rank {rank}: the device's activity stops {gap / 1e3:,.1f} ms before the "
                    f"host's last kernel launch ({n_after:,} launches after it): the "
                    f"profiler's activity buffer filled")
    sev = ("untrustworthy" if len(host_steps) == 1 else "caveat") if cut else None
    return Measured(C.CUT_SHORT, sev, (rank,), int(cut), len(host_steps),
                    (tail if tail > CUT_TAIL_SHARE * (b - a) else gap) if cut else None,
                    None, (last,) if cut else (), text)


def _precision(rank: int, events: pd.DataFrame) -> Measured:
    ts = events["ts_us"].to_numpy()
    if not len(ts):
        return Measured(C.TIMESTAMP_PRECISION, None, (rank,), 0)
    top = float(np.abs(ts).max())
    ulp = float(np.spacing(top))
    sev = "untrustworthy" if ulp >= PRECISION_UNTRUSTED_US else \
        "caveat" if ulp > PRECISION_CAVEAT_US else None
    return Measured(C.TIMESTAMP_PRECISION, sev, (rank,), int(sev is not None), None, ulp, None,
                    text=f"rank {rank}: times reach {top:.3g} µs, where float64 holds them only "
                         f"to {ulp:g} µs: every duration is rounded to that" if sev else "")
