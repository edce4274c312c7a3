"""Benchmark: the trace sets that need a large machine elsewhere, meshscope and HTA side by side.

    flock /tmp/meshscope-cpu.lock .venv/bin/python bench/large_vs_hta.py \\
        [--only single,cold,ranks,ranks1024] [-n 3] [--rank-counts 16,48,128] \\
        [--root /tmp/meshscope-large] [--keep] [--write] [--against REF]

Every measurement is a fresh process started the way a user starts it, timed from launch to
exit, its peak memory taken for its largest process and for its whole process tree
(``bench/measure.py``); the ratios are of processes run in this one invocation, one after the
other on the same inputs, so that the machine's load falls on both. What is run:

- **single** — one rank of 1.73M real events: the reference trace (``df_index_resolver``, 216k
  events) repeated 8 times in time (``bench/event_memory.replicate``: 379 MB of JSON, 31 MB
  gzipped). Three processes: HTA (load + ``get_comm_comp_overlap`` +
  ``get_temporal_breakdown``), ``meshscope analyze --no-cache`` (the whole report), and the
  machine's **decode limit**: a process that inflates the same file once, cuts its events
  into parts as the ingest does and decodes every part with msgspec on every core into
  structs of the event's fields (its arguments undecoded), building nothing — what any
  analysis of these bytes on these cores takes at the least. Targets: ≥ 20× HTA's time,
  ≤ ⅕ of its peak memory, within 3× of the decode limit.
- **cold** — the reference trace itself (54 MB of JSON), HTA and ``meshscope analyze
  --no-cache`` each as a cold process, ``-n`` rounds interleaved; medians and fastest runs.
  Beside them the **import floor**: a cold process that only imports the libraries every
  analysis here reads with (numpy, pandas, pyarrow, msgspec) and exits — no meshscope code,
  no event read. Target: ≥ 10× HTA.
- **ranks** — 16, 48 and 128 ranks (``--rank-counts``) of the 1.73M-event trace (~6, 18 and
  49 GB of JSON): the repeated trace with each rank's ``distributedInfo.rank`` and
  ``world_size`` rewritten, each file three gzip members — the rank's header, the events (the
  same compressed bytes in every file), the closing brackets — which every gzip reader
  inflates as one stream; each set written, analysed and removed before the next (128 ranks
  are 3.9 GB of gzip). ``meshscope analyze --no-cache`` of a folder of one of them and of each
  set. Targets: peak memory ≤ 3 GB at 16 ranks; memory flat in the rank count: the largest
  count's peak (largest process and all processes) within 10% of the smallest's; time linear
  in the ranks: per rank and core, the 16-rank run within ±15% of the one-rank run (both use
  every core: one trace in parts, many traces a worker each). HTA is not run on them: at its
  ~2 GB a rank above, 16 ranks need about 32 GB, more than this machine has.
- **ranks1024** — 1,024 synthetic ranks of 100k events (``bench/scale.py``'s run, dp = 512 ×
  pp = 2). Target: the whole report in under 5 minutes on 2 cores. (HTA is not run: 2.5 GB of
  gzipped traces, over 100 GB in its frames.)

``--against REF`` (a git revision) checks that a change left every report as it was: the
smallest rank count's set is analysed a second time by the tree of REF (``git archive``, run
with the same interpreter) and the two reports compared file by file — every parquet file
byte for byte, or where the bytes differ, the same table (schema, metadata, every value:
``pyarrow.Table.equals``) in other row groups (a table of more than
``table_parts.ROWS_PER_GROUP`` rows is written a row group at a time since issue 51), said
so; ``summary.json`` but its ``generated`` time.

The generated traces live under ``--root`` (never in the repository) and are deleted at the
end unless ``--keep``. ``--write`` puts the section into docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tarfile
import zlib

if __package__ in (None, ""):   # run as a script: bench/ is not a package then
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.measure import MESHSCOPE, ROOT, load_note, measure, met, provenance, publish, \
    versions  # noqa: E402
from bench.report_vs_hta import DEFAULT_TRACE, HTA_SCRIPT  # noqa: E402

HEADING = "## Large traces and many ranks vs HTA"
COPIES = 8
TARGETS = {"single_speed": 20.0, "single_rss": 0.2, "decode": 3.0, "cold_speed": 10.0,
           "ranks16_gb": 3.0, "linear": 0.15, "ranks1024_s": 300.0, "flat": 0.10}

# The decode limit (module docstring): inflate once, cut with the ingest's own cutter, decode
# each part with msgspec on every core, keep nothing.
DECODE_SCRIPT = """
import os, sys
from concurrent.futures import ProcessPoolExecutor
import multiprocessing as mp
import msgspec
from meshscope.analysis.ingest.json_stream import EventStream

class Event(msgspec.Struct, gc=False):
    ph: object = None
    name: object = None
    cat: object = None
    ts: object = None
    dur: object = None
    pid: object = None
    tid: object = None
    args: msgspec.Raw = msgspec.Raw(b"")

DECODE = msgspec.json.Decoder(list[Event])

def decode(text, last):
    if not last:
        return len(DECODE.decode(b"[" + text + b"]"))
    return sum(len(b) for b in EventStream(b"[" + text, DECODE.decode).batches(keep_tail=True))

with open(sys.argv[1], "rb") as f:
    raw = f.read()
stream = EventStream(raw, None)
with ProcessPoolExecutor(os.cpu_count(), mp_context=mp.get_context("fork")) as pool:
    futures = [pool.submit(decode, text, last) for text, last in stream.parts(8 << 20)]
    n = sum(f.result() for f in futures)
print(n)
"""


def _analyze(path: pathlib.Path, out: pathlib.Path, keep: bool = False,
             tree: pathlib.Path | None = None):
    """``meshscope analyze --no-cache`` of ``path`` into ``out`` as a measured process (by the
    source tree ``tree``: None, this one); the report removed after unless ``keep``."""
    shutil.rmtree(out, ignore_errors=True)
    env = None if tree is None else {"PYTHONPATH": str(tree)}
    m = measure([*MESHSCOPE, "analyze", "--no-cache", str(path), "--out", str(out)],
                env=env, cwd=ROOT if tree is None else tree, timeout_s=4 * 3600, pss=True)
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return m


def tree_at(rev: str, root: pathlib.Path) -> pathlib.Path:
    """The source tree of git revision ``rev`` under ``root`` (``git archive``)."""
    dest = root / f"tree-{rev.replace('/', '_')}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT,
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(dest, filter="tar")
    return dest


def report_differences(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    """The files of report ``a`` that differ from ``b``'s: parquet by content — byte for
    byte, else the same schema, metadata and every value (``pyarrow.Table.equals``) in other
    row groups, said as such —, summary.json but its ``generated`` time; files in one only."""
    names = sorted({p.name for p in a.iterdir() if p.is_file()} |
                   {p.name for p in b.iterdir() if p.is_file()})
    out = []
    for name in names:
        if not ((a / name).is_file() and (b / name).is_file()):
            out.append(f"{name} (in one only)")
        elif name == "summary.json":
            docs = [json.loads((d / name).read_text()) for d in (a, b)]
            for d in docs:
                d.pop("generated", None)
            if docs[0] != docs[1]:
                out.append(name)
        elif name.endswith(".parquet") and (a / name).read_bytes() != (b / name).read_bytes():
            import pyarrow.parquet as pq

            files = [pq.ParquetFile(d / name) for d in (a, b)]
            if not files[0].read().equals(files[1].read(), check_metadata=True):
                out.append(name)
            else:                   # the same table, in other row groups (a streamed write)
                groups = [f.metadata.num_row_groups for f in files]
                out.append(f"{name} (content identical; row groups {groups[0]} and "
                           f"{groups[1]}, not a difference)")
    return out


# The import floor (module docstring): what a cold process pays before any analysis can begin.
FLOOR_SCRIPT = "import msgspec, numpy, pandas, pyarrow, pyarrow.compute, pyarrow.parquet"


def _hta(folder: pathlib.Path):
    return measure([MESHSCOPE[0], "-c", HTA_SCRIPT, str(folder)], env={"PYTHONPATH": str(ROOT)},
                   timeout_s=4 * 3600, pss=True)


def _gb(mb: float) -> str:
    return f"{mb / 1024:.2f} GB"


def single(root: pathlib.Path) -> tuple[list[str], list[str]]:
    from bench.event_memory import replicate

    folder = root / "single"
    trace = folder / "rank1.json.gz"
    if not trace.exists():
        folder.mkdir(parents=True, exist_ok=True)
        print("  single: writing the 8× trace …", file=sys.stderr, flush=True)
        replicate(DEFAULT_TRACE, COPIES, trace)
    print("  single: HTA …", file=sys.stderr, flush=True)
    hta = _hta(folder)
    print(f"  single: HTA {hta.wall_s:.1f} s; meshscope …", file=sys.stderr, flush=True)
    ms = _analyze(trace, root / "single-report")
    print(f"  single: meshscope {ms.wall_s:.1f} s; decode limit …", file=sys.stderr, flush=True)
    dec = measure([MESHSCOPE[0], "-c", DECODE_SCRIPT, str(trace)], env={"PYTHONPATH": str(ROOT)},
                  pss=True)
    rows = [("HTA: load + `get_comm_comp_overlap` + `get_temporal_breakdown`", hta),
            ("`meshscope analyze --no-cache` (the whole report)", ms),
            (f"decode limit: inflate, cut, msgspec decode on {os.cpu_count()} cores, no table",
             dec)]
    lines = ["| process | wall time | HTA's time ÷ this | peak RSS, largest process | "
             "of HTA's | peak RSS, all processes | of HTA's | peak PSS, all processes | "
             "of HTA's |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, m in rows:
        lines.append(f"| {label} | {m.wall_s:.2f} s | {hta.wall_s / m.wall_s:.1f}× | "
                     f"{m.peak_rss_mb:,.0f} MB | {m.peak_rss_mb / hta.peak_rss_mb:.2f} | "
                     f"{m.peak_tree_rss_mb:,.0f} MB | "
                     f"{m.peak_tree_rss_mb / hta.peak_tree_rss_mb:.2f} | "
                     f"{m.peak_tree_pss_mb:,.0f} MB | "
                     f"{m.peak_tree_pss_mb / hta.peak_tree_pss_mb:.2f} |")
    speed = hta.wall_s / ms.wall_s
    rss = ms.peak_rss_mb / hta.peak_rss_mb
    tree = ms.peak_tree_rss_mb / hta.peak_tree_rss_mb
    pss = ms.peak_tree_pss_mb / hta.peak_tree_pss_mb
    limit = ms.wall_s / dec.wall_s
    verdicts = [
        f"- 1.73M events ≥ {TARGETS['single_speed']:.0f}× faster than HTA: {speed:.1f}× — "
        f"{met(speed >= TARGETS['single_speed'])}; the decode limit itself is "
        f"{hta.wall_s / dec.wall_s:.1f}× HTA, the most any analysis of these bytes on these "
        f"cores can reach",
        f"- peak memory ≤ ⅕ of HTA's: {rss:.2f} (largest process), {pss:.2f} (all processes, "
        f"shared pages once), {tree:.2f} (all processes, RSS summed: a forked worker's pages "
        f"still shared with its parent counted twice) — "
        f"{met(max(rss, tree) <= TARGETS['single_rss'])} counting the RSS sum, "
        f"{met(max(rss, pss) <= TARGETS['single_rss'])} counting shared pages once",
        f"- within {TARGETS['decode']:.0f}× of the decode limit: {limit:.2f}× — "
        f"{met(limit <= TARGETS['decode'])}"]
    return lines, verdicts


def cold(root: pathlib.Path, n: int) -> tuple[list[str], list[str]]:
    folder = root / "cold"
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / DEFAULT_TRACE.name
    shutil.copy(DEFAULT_TRACE, trace)
    runs = {"hta": [], "meshscope": [], "floor": []}
    for i in range(n):
        runs["hta"].append(_hta(folder))
        runs["meshscope"].append(_analyze(trace, root / "cold-report"))
        runs["floor"].append(measure([MESHSCOPE[0], "-c", FLOOR_SCRIPT], pss=True))
        print(f"  cold: round {i + 1}/{n}: HTA {runs['hta'][-1].wall_s:.2f} s, meshscope "
              f"{runs['meshscope'][-1].wall_s:.2f} s, import floor "
              f"{runs['floor'][-1].wall_s:.2f} s", file=sys.stderr, flush=True)
    med = {k: statistics.median(m.wall_s for m in v) for k, v in runs.items()}
    best = {k: min(m.wall_s for m in v) for k, v in runs.items()}
    rss = {k: statistics.median(m.peak_rss_mb for m in v) for k, v in runs.items()}
    lines = ["| process | wall time (median) | × faster than HTA | fastest run | × (fastest) | "
             "peak RSS, largest process | of HTA's |", "|---|---:|---:|---:|---:|---:|---:|"]
    for k, label in (("hta", "HTA: load + overlap + temporal breakdown"),
                     ("meshscope", "`meshscope analyze --no-cache`, a cold process"),
                     ("floor", "import floor: numpy, pandas, pyarrow, msgspec imported, "
                               "nothing read")):
        lines.append(f"| {label} | {med[k]:.2f} s | {med['hta'] / med[k]:.1f}× | "
                     f"{best[k]:.2f} s | {best['hta'] / best[k]:.1f}× | {rss[k]:.0f} MB | "
                     f"{rss[k] / rss['hta']:.2f} |")
    speed, speed_best = med["hta"] / med["meshscope"], best["hta"] / best["meshscope"]
    ceiling = med["hta"] / med["floor"]
    return lines, [f"- 54 MB cold ≥ {TARGETS['cold_speed']:.0f}× HTA: {speed:.1f}× (medians), "
                   f"{speed_best:.1f}× (fastest runs) — "
                   f"{met(min(speed, speed_best) >= TARGETS['cold_speed'])}; the import floor "
                   f"alone is {med['floor']:.2f} s, so no analysis that reads with these "
                   f"libraries can be more than {ceiling:.1f}× HTA here"]


def write_ranks(folder: pathlib.Path, ranks: int, base: pathlib.Path) -> tuple[int, int]:
    """``ranks`` traces of the 8× trace ``base`` (made if missing) under ``folder`` (module
    docstring: three gzip members each, the events' member shared); (JSON bytes, gzip bytes)
    of one."""
    from bench.event_memory import replicate

    if not base.exists():
        base.parent.mkdir(parents=True, exist_ok=True)
        replicate(DEFAULT_TRACE, COPIES, base)
    doc = json.loads(gzip.decompress(base.read_bytes()))
    events = doc.pop("traceEvents")
    body = json.dumps(events)[1:-1].encode()
    del events
    shared = _member(body)
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        meta = dict(doc, distributedInfo={**doc.get("distributedInfo", {}), "rank": r,
                                          "world_size": ranks})
        head = json.dumps(meta)[:-1].encode() + b', "traceEvents": ['
        with open(folder / f"rank{r}.json.gz", "wb") as f:
            f.write(_member(head) + shared + _member(b"]}"))
    size = (folder / "rank0.json.gz").stat().st_size
    return len(head) + len(body) + 2, size


def _member(data: bytes) -> bytes:
    c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def ranks(root: pathlib.Path, counts: list[int], against: str | None = None
          ) -> tuple[list[str], list[str]]:
    """One rank, then each of ``counts`` ranks of the 1.73M-event trace (each set written,
    analysed and removed before the next: 128 ranks are 3.9 GB of gzip); with ``against``,
    the smallest set's report compared with the one the tree of that revision writes."""
    base = root / "single" / "rank1.json.gz"
    one = root / "ranks1" / "traces"
    write_ranks(one, 1, base)
    print("  ranks: one rank …", file=sys.stderr, flush=True)
    runs = {1: _analyze(one.parent, root / "ranks1-report")}
    shutil.rmtree(one.parent, ignore_errors=True)
    text_bytes = gz_bytes = 0
    same = None
    for n in counts:
        folder = root / f"ranks{n}" / "traces"
        print(f"  ranks: writing {n} ranks …", file=sys.stderr, flush=True)
        text_bytes, gz_bytes = write_ranks(folder, n, base)
        print(f"  ranks: {n} ranks …", file=sys.stderr, flush=True)
        compare = against is not None and n == min(counts)
        runs[n] = _analyze(folder.parent, root / f"ranks{n}-report", keep=compare)
        if compare:
            print(f"  ranks: {n} ranks by {against}'s tree …", file=sys.stderr, flush=True)
            theirs = root / f"ranks{n}-report-{against.replace('/', '_')}"
            _analyze(folder.parent, theirs, keep=True, tree=tree_at(against, root))
            found = report_differences(root / f"ranks{n}-report", theirs)
            differ = [d for d in found if "not a difference" not in d]
            regrouped = [d for d in found if "not a difference" in d]
            same = (f"- every report file of {n} ranks identical to {against}'s "
                    f"(parquet byte for byte, summary.json but its time): "
                    + ("yes" if not differ else f"**no** — {', '.join(differ)}")
                    + (f"; {', '.join(regrouped)}" if regrouped else ""))
            for d in (root / f"ranks{n}-report", theirs):
                shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(folder.parent, ignore_errors=True)
        print(f"  ranks: {n} ranks {runs[n].wall_s:.1f} s, largest process "
              f"{runs[n].peak_rss_mb:,.0f} MB, all {runs[n].peak_tree_rss_mb:,.0f} MB",
              file=sys.stderr, flush=True)
    lines = ["| traces | JSON | `analyze --no-cache` | per rank | peak RSS, largest process | "
             "peak RSS, all processes | peak PSS, all processes |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for n, m in runs.items():
        lines.append(f"| {n} | {n * text_bytes / 1e9:.1f} GB | {m.wall_s:.1f} s | "
                     f"{m.wall_s / n:.2f} s | {m.peak_rss_mb:,.0f} MB | "
                     f"{m.peak_tree_rss_mb:,.0f} MB | {m.peak_tree_pss_mb:,.0f} MB |")
    first, last = min(counts), max(counts)
    m_first, m_last = runs[first], runs[last]
    per = m_first.wall_s / (first * runs[1].wall_s)
    verdicts = [
        f"- {first} × 1.73M events, peak memory ≤ {TARGETS['ranks16_gb']:.0f} GB: "
        f"{_gb(m_first.peak_tree_rss_mb)} (all processes), {_gb(m_first.peak_rss_mb)} "
        f"(largest) — {met(m_first.peak_tree_rss_mb <= TARGETS['ranks16_gb'] * 1024)}",
        f"- time linear in ranks: per rank and core, {first} ranks take {per:.2f}× the "
        f"one-rank run ({gz_bytes / 2**20:.0f} MB gzipped a rank) — "
        f"{met(abs(per - 1) <= TARGETS['linear'])}"]
    if last != first:
        grow_tree = m_last.peak_tree_rss_mb / m_first.peak_tree_rss_mb - 1
        grow_big = m_last.peak_rss_mb / m_first.peak_rss_mb - 1
        verdicts.append(
            f"- memory flat in the rank count, {last} ranks within "
            f"{TARGETS['flat'] * 100:.0f}% of {first}: {grow_big * 100:+.0f}% (largest "
            f"process), {grow_tree * 100:+.0f}% (all processes) — "
            f"{met(max(grow_big, grow_tree) <= TARGETS['flat'])}; "
            f"{(m_last.peak_tree_rss_mb - m_first.peak_tree_rss_mb) / (last - first):.1f} MB "
            f"a rank beyond {first} (all processes)")
    if same is not None:
        verdicts.append(same)
    return lines, verdicts


def ranks1024(root: pathlib.Path) -> tuple[list[str], list[str]]:
    from bench.scale import analyse, generate

    run, info = generate(root, 1024, 100_000, 2)
    print(f"  ranks1024: generated ({info['trace_mb']:.0f} MB); analysing …", file=sys.stderr,
          flush=True)
    row = analyse(run)
    lines = ["| ranks | events per rank | traces on disk | `analyze --no-cache` | peak RSS, "
             "largest process | peak RSS, all processes | ranks analysed |",
             "|---:|---:|---:|---:|---:|---:|---:|",
             f"| 1,024 | {info['events_per_rank']:,} | {info['trace_mb']:,.0f} MB | "
             f"{row['wall_s']:.1f} s | {row['rss_mb']:.0f} MB | {row['tree_mb']:.0f} MB | "
             f"{row['ranks_analysed']} |"]
    return lines, [f"- 1,024 ranks × 100k events in under 5 minutes on {os.cpu_count()} "
                   f"cores: {row['wall_s'] / 60:.1f} min — "
                   f"{met(row['wall_s'] < TARGETS['ranks1024_s'])}"]


PARTS = {"single": "One rank of 1.73M events (the reference trace 8× in time)",
         "cold": "The 54 MB reference trace, cold",
         "ranks": "16, 48 and 128 ranks of 1.73M events",
         "ranks1024": "1,024 synthetic ranks of 100k events"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(PARTS), help="parts to run (comma-separated)")
    ap.add_argument("-n", type=int, default=3, help="rounds of the cold comparison")
    ap.add_argument("--root", type=pathlib.Path, default=pathlib.Path("/tmp/meshscope-large"))
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    ap.add_argument("--rank-counts", default="16,48,128",
                    help="the rank counts of the ranks part (comma-separated)")
    ap.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
    ap.add_argument("--against", metavar="REF",
                    help="also analyse the smallest rank count's set with the tree of git "
                         "revision REF and compare the reports (module docstring)")
    a = ap.parse_args()
    parts = [p for p in a.only.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)} (known: {', '.join(PARTS)})")
    if not DEFAULT_TRACE.exists():
        raise SystemExit(f"{DEFAULT_TRACE}: no such file (the shared trace corpus is missing?)")
    counts = sorted({int(x) for x in a.rank_counts.split(",") if x})
    if "ranks" in parts:
        PARTS["ranks"] = f"{', '.join(map(str, counts))} ranks of 1.73M events"
    a.root.mkdir(parents=True, exist_ok=True)
    note = load_note()
    body = []
    try:
        for part in parts:
            lines, verdicts = {"single": single, "cold": lambda r: cold(r, a.n),
                               "ranks": lambda r: ranks(r, counts, a.against),
                               "ranks1024": ranks1024}[part](a.root)
            body += [f"**{PARTS[part]}**", "", *lines, "", *verdicts, ""]
    finally:
        if not a.keep:
            shutil.rmtree(a.root, ignore_errors=True)
    command = "bench/large_vs_hta.py" + (f" --only {a.only}" if set(parts) != set(PARTS)
                                         else "") + (f" -n {a.n}" if a.n != 3 else "") + \
        (f" --rank-counts {a.rank_counts}" if a.rank_counts != "16,48,128" else "") + \
        (f" --against {a.against}" if a.against else "")
    section = "\n".join([HEADING, "",
                         provenance(f"flock /tmp/meshscope-cpu.lock .venv/bin/python {command}",
                                    note, versions(), f"load average at the end "
                                    f"{os.getloadavg()[0]:.1f}"), "", *body])
    publish(HEADING, section, a.write)


if __name__ == "__main__":
    main()
