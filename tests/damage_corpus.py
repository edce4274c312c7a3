"""The damaged-input corpus: copies of a shipped sample run, each damaged in one way.

Every ``Case`` copies a sample (``samples/`` is read-only: the copy goes to a temporary folder,
without its report), applies its ``damage`` to the copy, and says what ``meshscope analyze``
must do with it (``tests/test_damaged_input.py`` runs them): the exit code, the words the one
problem line (or, for exit code 2, the one error line) must hold — the file and the field —
and which ranks must come out with exactly the per-rank numbers of the undamaged run.

The damages are those of issue 14 (reproduced by a careless or hostile user on
``dp2-pp2-1f1b``, rank 1's files) and more: inside trace events, in a trace's metadata, in
run.json, in Flight Recorder dumps and step timers, in the identity of files (two files
claiming one rank, traces of different jobs) and in the folder's shape (symbolic links).
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import pathlib
import shutil
from typing import Callable

from conftest import ROOT

SAMPLE = "dp2-pp2-1f1b"
DEEP = "\u0000DEEP\u0000"           # replaced by 10^5 nested lists after json.dumps
HUGE_FLOAT = "\u0000HUGE\u0000"     # replaced by 1e400 (beyond any float)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    damage: Callable[[pathlib.Path], None]
    exit_code: int = 0
    needles: tuple[str, ...] = ()            # all in one problem line, or in the error line
    good_ranks: tuple[int, ...] = (0, 2, 3)  # per-rank numbers equal to the undamaged run's
    ranks: tuple[int, ...] | None = None     # the ranks analysed (default: every rank)
    foreign: bool = False                    # run.json unusable: analysed as plain traces
    args: tuple[str, ...] = ()
    target: str = "."                        # what to analyse, relative to the copy
    clock_skew: bool = False                 # the issue's +10 s case: compare cross-rank too
    xfail: str | None = None                 # why this case cannot pass yet (strict)


def copy_sample(dest: pathlib.Path, sample: str = SAMPLE) -> pathlib.Path:
    shutil.copytree(ROOT / "samples" / sample, dest)
    shutil.rmtree(dest / "report", ignore_errors=True)
    return dest


def _dumps(doc) -> bytes:
    text = json.dumps(doc)
    text = text.replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000)
    return text.replace(json.dumps(HUGE_FLOAT), "1e400").encode()


def edit_trace(run: pathlib.Path, rank: int, change: Callable[[dict], None]) -> None:
    path = run / "traces" / f"rank{rank}.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    change(doc)
    path.write_bytes(gzip.compress(_dumps(doc), compresslevel=1))


def edit_json(path: pathlib.Path, change: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_bytes(_dumps(doc))


def first(doc: dict, pred) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and pred(e))


def named(prefix: str):
    return lambda e: isinstance(e.get("name"), str) and e["name"].startswith(prefix)


def trace(change) -> Callable[[pathlib.Path], None]:
    return lambda run: edit_trace(run, 1, change)


def run_json(change) -> Callable[[pathlib.Path], None]:
    return lambda run: edit_json(run / "run.json", change)


def dump(change) -> Callable[[pathlib.Path], None]:
    return lambda run: edit_json(run / "comms" / "rank1.json", change)


def cut_in_half(rel: str) -> Callable[[pathlib.Path], None]:
    def damage(run):
        victim = run / rel
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    return damage


def write(rel: str, data: bytes) -> Callable[[pathlib.Path], None]:
    return lambda run: (run / rel).write_bytes(data)


def _set(path: list, value):
    def change(doc):
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value
    return change


def _pop(path: list):
    def change(doc):
        for key in path[:-1]:
            doc = doc[key]
        doc.pop(path[-1])
    return change


def _all_events(change):
    def apply(doc):
        for e in doc["traceEvents"]:
            change(e)
    return apply


def _every_other_without_ts(doc):
    for e in doc["traceEvents"][::2]:
        e.pop("ts", None)


def _shift_clock(doc):
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += 10e6                     # +10 s, in µs


def _steps(doc):
    return [e for e in doc["traceEvents"] if named("ProfilerStep")(e)]


def _foreign_folder_with_link(run: pathlib.Path):
    """A plain folder of traces, half of them behind a symbolic link to a folder beside it."""
    traces = run / "traces"
    other = run.parent / "elsewhere"
    other.mkdir()
    for r in (2, 3):
        shutil.move(str(traces / f"rank{r}.json.gz"), other / f"rank{r}.json.gz")
    os.symlink(other, traces / "more")


def _folder_with_link_inside(run: pathlib.Path):
    """A plain folder of traces (no run.json), half of them in a folder inside it that
    ``traces/more`` links to: read once, through whichever path comes first."""
    (run / "run.json").unlink()
    other = run / "elsewhere"
    other.mkdir()
    for r in (2, 3):
        shutil.move(str(run / "traces" / f"rank{r}.json.gz"), other / f"rank{r}.json.gz")
    os.symlink(other, run / "traces" / "more")


def _link_loop(run: pathlib.Path):
    os.symlink(run / "traces", run / "traces" / "again")


def _broken_link(run: pathlib.Path):
    os.symlink(run / "nowhere.json.gz", run / "traces" / "rank7.json.gz")


def _second_path_to_a_file(run: pathlib.Path):
    os.symlink(run / "traces" / "rank1.json.gz", run / "traces" / "copy-rank1.json.gz")


def _rank_outside_the_world(run: pathlib.Path):
    """A seventh rank's file in a run of four, without distributedInfo: its name says 7."""
    shutil.copy(run / "traces" / "rank1.json.gz", run / "traces" / "rank7.json.gz")
    edit_trace(run, 7, _pop(["distributedInfo"]))


def _traces_of_another_run(run: pathlib.Path):
    """Every trace from another run than run.json describes (the same layout)."""
    for r in range(4):
        edit_trace(run, r, _set(["meshscope", "run_id"], "0123456789ab"))


def _no_traces(run: pathlib.Path):
    shutil.rmtree(run / "traces")


def _world_too_large_for_the_files(doc):
    """A consistent layout of 40 ranks (dp=20 × pp=2) described by a run that left 4 files."""
    doc.update(world_size=40, layout_str="dp=20,pp=2")
    doc["layout"]["dp"] = 20
    doc["mesh"]["shape"] = [2, 20]


def _pg_without_dimension(doc):
    doc["process_groups"][0].pop("dimension")


# -- issue 24: what is not a regular file, and traces past a reading budget --------------------

def _fifo(rel: str) -> Callable[[pathlib.Path], None]:
    """``rel`` replaced by a FIFO: opened for reading, it would block forever."""
    def damage(run):
        (run / rel).unlink()
        os.mkfifo(run / rel)
    return damage


def _link(rel: str, to) -> Callable[[pathlib.Path], None]:
    def damage(run):
        target = to(run) if callable(to) else to
        (run / rel).unlink()
        os.symlink(target, run / rel)
    return damage


def _outside_copy(run: pathlib.Path) -> pathlib.Path:
    """rank 1's trace copied beside the run folder, outside it."""
    other = run.parent / "outside-rank1.json.gz"
    shutil.copy(run / "traces" / "rank1.json.gz", other)
    return other


def _bomb(run: pathlib.Path, inflated: int = 96 << 20):
    """rank 1's trace: a few hundred KB of gzip that inflate to ``inflated`` bytes of white
    space inside traceEvents."""
    import zlib
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [z.compress(b'{"traceEvents":[')]
    block = b" " * (1 << 20)
    parts += [z.compress(block) for _ in range(inflated >> 20)]
    parts.append(z.compress(b"]}") + z.flush())
    (run / "traces" / "rank1.json.gz").write_bytes(b"".join(parts))


def _levels(n: int) -> list:
    """A value ``n`` levels deep (``n`` nested lists)."""
    value: list = []
    for _ in range(n - 1):
        value = [value]
    return value


def _more_events(doc):
    """20,000 more (unknown, harmless) events than the other ranks have."""
    doc["traceEvents"] += [{"ph": "i", "name": "pad", "ts": 1, "pid": 1, "tid": 1}] * 20_000


def _long_name(doc):
    first(doc, named(""))["name"] = "x" * (2 << 20)


ALL = (0, 1, 2, 3)
TRACE = "rank1.json.gz"
RUN = "run.json"
DUMP = "rank1.json"

CASES = [
    # -- inside trace events: dropped or ignored, counted, named; the rank is still analysed
    # (with the nesting budget raised past the decoder's limit: at the default the file is
    # refused, "trace-nested-past-the-budget" below)
    Case("event-args-nested-1e5-deep",
         trace(lambda d: first(d, named("aten::")).setdefault("args", {}).update(x=DEEP)),
         args=("--max-nesting", "1000000"), needles=(TRACE, "traceEvents", "nested deeper")),
    Case("correlation-2^70",
         trace(lambda d: first(d, named("aten::")).setdefault("args", {}).update(
             correlation=2**70)),
         needles=(TRACE, "args.correlation", "1 event"), good_ranks=ALL),
    Case("input-dims-2^70",
         trace(lambda d: first(d, named("gloo:all_reduce"))["args"].update(
             {"Input Dims": [[2**70]]})),
         needles=(TRACE, "args.Input Dims", "1 event"), good_ranks=ALL),
    Case("in-msg-nelems-2^70",
         trace(lambda d: first(d, named("gloo:all_reduce"))["args"].update(
             {"Collective name": "all_reduce", "In msg nelems": 2**70, "dtype": "Float"})),
         needles=(TRACE, "args.In msg nelems", "1 event"), good_ranks=ALL),
    Case("collective-name-arg-a-number",
         trace(lambda d: first(d, named("gloo:all_reduce"))["args"].update(
             {"Collective name": 42})),
         needles=(TRACE, "args.Collective name", "not a string"), good_ranks=ALL),
    Case("collective-name-a-number",
         trace(lambda d: first(d, named("gloo:all_reduce")).update(name=42)),
         needles=(TRACE, "name", "1 event dropped", "not a string")),
    Case("profiler-step-dur-1e300",
         trace(lambda d: _steps(d)[0].update(dur=1e300)),
         needles=(TRACE, "dur", "1 event dropped", "longer than the trace")),
    Case("one-ts-1e300",
         trace(lambda d: first(d, named("aten::")).update(ts=1e300)),
         needles=(TRACE, "ts", "1 event dropped", "outside the trace's span")),
    Case("one-ts-beyond-float",
         trace(lambda d: first(d, named("aten::")).update(ts=HUGE_FLOAT)),
         needles=(TRACE, "traceEvents", "1 event dropped", "out of range")),
    Case("one-dur-a-string",
         trace(lambda d: first(d, named("aten::")).update(dur="12")),
         needles=(TRACE, "dur", "1 event dropped", "not a number")),
    Case("one-negative-dur",
         trace(lambda d: first(d, named("aten::")).update(dur=-5)),
         needles=(TRACE, "dur", "1 event dropped", "negative")),
    Case("cat-a-list",
         trace(lambda d: first(d, named("aten::")).update(cat=["cpu_op"])),
         needles=(TRACE, "cat", "1 event dropped", "not a string")),
    # issue 35: an event with no phase vanished unmentioned (a gloo:all_reduce's, here: the
    # communication time changed), one without pid/tid went to a made-up thread unsaid
    Case("event-without-ph",
         trace(lambda d: first(d, named("gloo:all_reduce")).pop("ph")),
         needles=(TRACE, "ph", "1 event dropped", "missing, or not one of")),
    Case("event-with-an-unknown-ph",
         trace(lambda d: first(d, named("aten::")).update(ph="Q")),
         needles=(TRACE, "ph", "1 event dropped", "event phases")),
    Case("event-without-pid-tid",
         trace(lambda d: [first(d, named("aten::")).pop(k) for k in ("pid", "tid")]),
         needles=(TRACE, "pid/tid", "1 event", "thread is unknown")),
    Case("event-not-an-object",
         trace(lambda d: d["traceEvents"].insert(5, "garbage")),
         needles=(TRACE, "traceEvents", "not an object"), good_ranks=ALL),
    # -- so damaged that the rank is refused (its numbers would be bent); the others kept
    Case("every-dur-negative",
         trace(_all_events(lambda e: e.update(dur=-abs(e["dur"]) - 1) if "dur" in e
                           else None)),
         needles=(TRACE, "dur", "negative"), ranks=(0, 2, 3)),
    Case("half-the-events-without-ts", trace(_every_other_without_ts),
         needles=(TRACE, "too damaged", "ts", "missing"), ranks=(0, 2, 3)),
    Case("trace-truncated", cut_in_half("traces/rank1.json.gz"),
         needles=(TRACE, "truncated"), ranks=(0, 2, 3)),
    Case("trace-empty", write("traces/rank1.json.gz", b""),
         needles=(TRACE, "empty"), ranks=(0, 2, 3)),
    Case("trace-not-json", write("traces/rank1.json.gz", gzip.compress(b"{not json")),
         needles=(TRACE, "JSON"), ranks=(0, 2, 3)),
    Case("trace-nan-literal",
         write("traces/rank1.json.gz", gzip.compress(b'{"traceEvents": [{"ph": "X", '
                                                     b'"ts": NaN}]}')),
         needles=(TRACE, "JSON"), ranks=(0, 2, 3)),
    Case("trace-events-not-a-list", trace(_set(["traceEvents"], {"a": 1})),
         needles=(TRACE, "traceEvents"), ranks=(0, 2, 3)),
    # -- in a trace's metadata: the value is ignored, the rank analysed
    Case("distributed-info-rank-true", trace(_set(["distributedInfo", "rank"], True)),
         needles=(TRACE, "distributedInfo.rank", "true"), good_ranks=ALL),
    Case("distributed-info-rank-negative", trace(_set(["distributedInfo", "rank"], -3)),
         needles=(TRACE, "distributedInfo.rank"), good_ranks=ALL),
    Case("distributed-info-not-an-object", trace(_set(["distributedInfo"], [1, 2])),
         needles=(TRACE, "distributedInfo", "expected an object"), good_ranks=ALL),
    Case("pg-config-garbage", trace(_set(["distributedInfo", "pg_config"], [5, "x"])),
         needles=(TRACE, "distributedInfo.pg_config"), good_ranks=ALL),
    Case("base-time-negative", trace(_set(["baseTimeNanoseconds"], -5)),
         needles=(TRACE, "baseTimeNanoseconds"), good_ranks=ALL),
    Case("metadata-nested-1e5-deep", trace(_set(["deviceProperties"], DEEP)),
         args=("--max-nesting", "1000000"),
         needles=(TRACE, "deviceProperties", "nested deeper"), good_ranks=ALL),
    # -- the clock of rank 1 is 10 s ahead: aligned, never a bubble (issue 14's contract)
    Case("clock-skew-plus-10s", trace(_shift_clock), good_ranks=ALL, clock_skew=True),
    # -- identity: named, the analysis stops unless --rank-regex settles it
    Case("two-files-claim-rank-0", trace(_set(["distributedInfo", "rank"], 0)),
         exit_code=2, needles=("rank1.json.gz", "rank0.json.gz", "claim rank 0",
                               "--rank-regex")),
    Case("two-files-claim-rank-0-settled-by-rank-regex",
         trace(_set(["distributedInfo", "rank"], 0)), args=("--rank-regex", r"rank(\d+)"),
         needles=(TRACE, "distributedInfo.rank is 0", "read as rank 1"), good_ranks=ALL),
    Case("traces-of-two-world-sizes", trace(_set(["distributedInfo", "world_size"], 8)),
         exit_code=2, needles=("rank1.json.gz", "world_size", "8")),
    Case("traces-of-two-runs", trace(_set(["meshscope", "run_id"], "0123456789ab")),
         exit_code=2, needles=("rank1.json.gz", "run id", "0123456789ab")),
    Case("traces-of-another-run-than-run-json", _traces_of_another_run, exit_code=2,
         needles=("run.json", "another job", "0123456789ab")),
    Case("distributed-info-rank-beyond-world-size",
         trace(_set(["distributedInfo", "rank"], 7)),
         needles=(TRACE, "distributedInfo.rank", "7", "from the file name"), good_ranks=ALL),
    Case("distributed-info-rank-3-claims-another-file",
         trace(_set(["distributedInfo", "rank"], 3)),
         exit_code=2, needles=("rank1.json.gz", "rank3.json.gz", "claim rank 3")),
    Case("trace-rank-outside-the-world", _rank_outside_the_world, exit_code=2,
         needles=("rank7.json.gz", "rank 7", "outside the job's 4 ranks")),
    # -- the folder's shape: links followed once, loops and dead links named
    # a link leading out of the analysed folder is not followed (issue 35): named, skipped
    Case("symlinked-subfolder", _foreign_folder_with_link, target="traces",
         needles=("more/rank2.json.gz", "a link leaving the run folder"), good_ranks=(0, 1),
         ranks=(0, 1)),
    Case("symlinked-subfolder-inside", _folder_with_link_inside, good_ranks=ALL),
    Case("symlink-loop", _link_loop, needles=("again", "skipped", "already read"),
         good_ranks=ALL),
    Case("broken-symlink", _broken_link, needles=("rank7.json.gz", "broken link"),
         good_ranks=ALL),
    Case("second-path-to-a-file", _second_path_to_a_file,
         needles=("copy-rank1.json.gz", "the same file as"), good_ranks=ALL),
    # -- run.json: one line naming the field; the traces analysed alone
    Case("run-json-without-world-size", run_json(_pop(["world_size"])), foreign=True,
         needles=(RUN, "world_size", "required", "plain folder of traces"), good_ranks=ALL),
    Case("run-json-world-size-four", run_json(_set(["world_size"], "four")), foreign=True,
         needles=(RUN, "$.world_size", "'four'"), good_ranks=ALL),
    Case("run-json-world-size-1e9", run_json(_set(["world_size"], 10**9)), foreign=True,
         needles=(RUN, "$.world_size", "maximum"), good_ranks=ALL),
    Case("run-json-world-size-beyond-the-files", run_json(_world_too_large_for_the_files),
         foreign=True, needles=(RUN, "$.world_size", "40 ranks", "only 4"), good_ranks=ALL),
    Case("run-json-layout-product", run_json(_set(["layout", "dp"], 3)), foreign=True,
         needles=(RUN, "$.layout", "world_size is 4"), good_ranks=ALL),
    Case("run-json-pp-a-string", run_json(_set(["layout", "pp"], "2")), foreign=True,
         needles=(RUN, "$.layout.pp"), good_ranks=ALL),
    Case("run-json-mesh-null", run_json(_set(["mesh"], None)), foreign=True,
         needles=(RUN, "$.mesh"), good_ranks=ALL),
    Case("run-json-schedule-42", run_json(_set(["schedule"], 42)), foreign=True,
         needles=(RUN, "$.schedule"), good_ranks=ALL),
    Case("run-json-unknown-schedule", run_json(_set(["schedule"], "1f1b-fancy")), foreign=True,
         needles=(RUN, "$.schedule", "unknown schedule", "1f1b-fancy", "interleaved-1f1b"),
         good_ranks=ALL),
    Case("run-json-group-without-dimension", run_json(_pg_without_dimension), foreign=True,
         needles=(RUN, "$.process_groups[0]", "dimension"), good_ranks=ALL),
    Case("run-json-microbatches-0", run_json(_set(["microbatches"], 0)), foreign=True,
         needles=(RUN, "$.microbatches"), good_ranks=ALL),
    Case("run-json-rank-beyond-world", run_json(
        lambda d: d["process_groups"][0].update(ranks=[0, 9])), foreign=True,
        needles=(RUN, "$.process_groups[0].ranks", "rank 9"), good_ranks=ALL),
    Case("run-json-schema-version-2", run_json(_set(["schema_version"], 2)), foreign=True,
         needles=(RUN, "$.schema_version", "unknown version 2"), good_ranks=ALL),
    Case("run-json-nested-1e5-deep", run_json(_set(["command"], DEEP)), foreign=True,
         needles=(RUN, "nested deeper"), good_ranks=ALL),
    Case("run-json-not-json", write("run.json", b"{ no"), foreign=True,
         needles=(RUN, "not readable JSON"), good_ranks=ALL),
    Case("run-json-invalid-and-no-traces",
         lambda run: (_no_traces(run), run_json(_set(["world_size"], "four"))(run)),
         exit_code=2, needles=(RUN, "$.world_size")),
    # -- Flight Recorder dumps: a problem of that rank, the others compared
    Case("dump-entries-strings", dump(_set(["flight_recorder", "entries"], ["a", "b"])),
         needles=(DUMP, "$.flight_recorder.entries[0]", "object"), good_ranks=ALL),
    Case("dump-seq-a-string",
         dump(lambda d: d["flight_recorder"]["entries"][3].update(collective_seq_id="4")),
         needles=(DUMP, "$.flight_recorder.entries[3].collective_seq_id"), good_ranks=ALL),
    Case("dump-process-group-short",
         dump(lambda d: d["flight_recorder"]["entries"][0].update(process_group=["1"])),
         needles=(DUMP, "$.flight_recorder.entries[0].process_group"), good_ranks=ALL),
    Case("dump-claims-rank-3", dump(_set(["rank"], 3)),
         needles=(DUMP, "$.rank", "claims rank 3"), good_ranks=ALL),
    Case("dump-rank-true", dump(_set(["rank"], True)),
         needles=(DUMP, "$.rank"), good_ranks=ALL),
    Case("dump-nested-1e5-deep", dump(_set(["error"], DEEP)),
         needles=(DUMP, "nested deeper"), good_ranks=ALL),
    Case("dump-truncated", cut_in_half("comms/rank1.json"),
         needles=(DUMP, "not readable JSON"), good_ranks=ALL),
    Case("dump-schema-version-9", dump(_set(["schema_version"], 9)),
         needles=(DUMP, "$.schema_version", "9"), good_ranks=ALL),
    # -- step timers
    Case("step-timer-truncated", cut_in_half("steps/rank1.parquet"),
         needles=("rank1.parquet", "step-timer"), good_ranks=ALL),
    # -- issue 24: only regular files are opened; links stay inside the run folder
    Case("trace-a-fifo", _fifo("traces/rank1.json.gz"),
         needles=(TRACE, "a FIFO, not a regular file"), ranks=(0, 2, 3)),
    Case("trace-a-link-to-dev-zero", _link("traces/rank1.json.gz", "/dev/zero"),
         needles=(TRACE, "a character device, not a regular file"), ranks=(0, 2, 3)),
    Case("trace-a-link-leaving-the-run", _link("traces/rank1.json.gz", _outside_copy),
         needles=(TRACE, "a link leaving the run folder"), ranks=(0, 2, 3)),
    Case("run-json-a-fifo", _fifo("run.json"), foreign=True,
         needles=(RUN, "a FIFO, not a regular file"), good_ranks=ALL),
    Case("dump-a-fifo", _fifo("comms/rank1.json"),
         needles=(DUMP, "a FIFO, not a regular file"), good_ranks=ALL),
    Case("dump-a-link-to-dev-zero", _link("comms/rank1.json", "/dev/zero"),
         needles=(DUMP, "a character device"), good_ranks=ALL),
    Case("step-timer-a-fifo", _fifo("steps/rank1.parquet"),
         needles=("rank1.parquet", "a FIFO, not a regular file"), good_ranks=ALL),
    # -- issue 24: budgets, enforced while reading (lowered here to keep the inputs small)
    Case("trace-inflates-past-the-budget", _bomb, args=("--max-trace-bytes", "32MiB"),
         needles=(TRACE, "inflates to more than", "32 MiB", "--max-trace-bytes"),
         ranks=(0, 2, 3)),
    Case("trace-more-events-than-the-budget", trace(_more_events),
         args=("--max-events", "30000"),
         needles=(TRACE, "more than 30,000 events", "--max-events"), ranks=(0, 2, 3)),
    Case("trace-nested-past-the-budget",
         trace(lambda d: first(d, named("aten::")).setdefault("args", {}).update(x=DEEP)),
         needles=(TRACE, "nested more than 64 levels deep", "--max-nesting"),
         ranks=(0, 2, 3)),
    Case("metadata-nested-past-the-budget", trace(_set(["deviceProperties"], _levels(70))),
         needles=(TRACE, "nested more than 64 levels deep", "--max-nesting"),
         ranks=(0, 2, 3)),
    Case("trace-nested-past-a-lowered-budget",
         trace(lambda d: first(d, named("aten::")).setdefault("args", {}).update(
             x=_levels(10))),
         args=("--max-nesting", "12"),
         needles=(TRACE, "nested more than 12 levels deep", "--max-nesting"),
         ranks=(0, 2, 3)),
    Case("the-only-trace-nested-past-the-budget",
         trace(lambda d: first(d, named("aten::")).setdefault("args", {}).update(x=DEEP)),
         target="traces/rank1.json.gz", exit_code=2,
         needles=(TRACE, "nested more than 64 levels deep", "--max-nesting")),
    Case("trace-a-string-past-the-budget", trace(_long_name),
         args=("--max-event-bytes", "1MiB"),
         needles=(TRACE, "an event longer than", "1 MiB", "--max-event-bytes"),
         ranks=(0, 2, 3)),
]
