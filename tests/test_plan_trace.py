"""`meshscope plan --from TRACE`: anyone's Kineto trace calibrates a GPU job's GEMM rate (issue
49, item 3). Hand-made traces whose GEMM time is known by construction, the corpus' H100
trace for a real one, and the refusals (exit 2, one line naming the file). The command runs
in-process (click's runner: the subprocess start would be most of each test's time)."""
import gzip
import json

import pytest
from click.testing import CliRunner

from conftest import ROOT, shared_trace
from meshscope.cli import main
from meshscope.layouts.plan.devices import lookup
from meshscope.layouts.plan.trace_gemms import read_trace

MODEL = ROOT / "bench" / "plan_references" / "models" / "llama-3-8b.json"
H100_TRACE = "gpu/tracelens/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
N = 4096                     # one 4096³ bf16 product: 2 · 4096³ FLOPs
FLOPS = 2.0 * N ** 3
PLAN = ("plan", "--model-json", MODEL, "--world", 8, "--seq-len", 8192, "--global-batch",
        64, "--layouts", "dp=8", "--dp-modes", "fsdp", "--microbatches", 8, "--recompute",
        "full", "--json")


def meshscope(*args):
    """``meshscope ARGS`` in this interpreter: (exit code, stdout, stderr)."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def _trace(path, kernel_us, *, shapes=True, device="NVIDIA H100 80GB HBM3", memset_us=0.0):
    """One bf16 aten::mm of 4096³ whose kernel took ``kernel_us`` (after a memset of
    ``memset_us`` it launched, when given), an fp32 one (not counted), and two launches of 3
    and 5 µs."""
    args = {"External id": 1, "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    if shapes:
        args["Input Dims"] = [[N, N], [N, N]]
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0,
         "dur": 20.0, "args": args},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 110.0, "dur": 3.0, "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7,
         "ts": 120.0, "dur": kernel_us, "args": {"correlation": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 500.0,
         "dur": 20.0, "args": {"Input type": ["float", "float"],
                               "Input Dims": [[N, N], [N, N]]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 510.0, "dur": 5.0, "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_f32", "pid": 0, "tid": 7,
         "ts": 520.0, "dur": 900.0, "args": {"correlation": 8}},
    ]
    if memset_us:
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync", "pid": 1, "tid": 1,
             "ts": 105.0, "dur": 2.0, "args": {"correlation": 6}},
            {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
             "ts": 108.0, "dur": memset_us, "args": {"correlation": 6}}]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events, "deviceProperties": [{"name": device}]}, f)
    return path


def test_a_hand_made_trace_measures_its_gemm_and_launches(tmp_path):
    t = read_trace(_trace(tmp_path / "t.json.gz", 250.0))
    (g,) = t.gemms                                   # the fp32 product is not counted
    assert (g.m, g.n, g.k, g.kernel_us) == (N, N, N, 250.0)
    assert t.gemm_flops / (t.gemm_kernel_us * 1e-6) == pytest.approx(FLOPS / 250e-6)
    assert t.launches == 2 and t.launch_host_us == pytest.approx(4.0)
    assert lookup(t.device_name).name == "H100-SXM"


def test_a_memset_the_gemm_launched_is_its_time_in_the_report_and_the_plan(tmp_path):
    """cuBLAS zeroes a split-K product's output with a cudaMemsetAsync inside the operator: the
    one reading (the report's ``gemm_table``) counts it as the product's device time, in the
    trace read by ``plan --from`` and in the report analysed from it alike (the corpus' H100
    trace: 143 µs of memsets in 9.0 ms). The healthy neighbour: the fp32 product beside it,
    with no memset, is not counted at all."""
    from meshscope.analysis.gpu import kernels
    from meshscope.analysis.report import analyze

    path = _trace(tmp_path / "run" / "t.json.gz", 250.0, memset_us=10.0)
    t = read_trace(path)
    assert t.gemm_kernel_us == pytest.approx(260.0) and t.gemm_calls == 1
    report = analyze.analyze(path.parent, workers=1).gpu.gemms
    sixteen = report[report["dtype"] == "c10::BFloat16"]
    assert sixteen["kernel_us"].sum() == pytest.approx(t.gemm_kernel_us)
    assert kernels.gemm_shape("aten::mm", [[N, 64], [64, 32]]) == (N, 32, 64, 1)


def test_the_trace_gemm_rate_replaces_the_curve_and_the_plan_says_so(tmp_path):
    """A trace whose GEMM ran faster than the H100 curve expects makes the plan faster, a
    slower one slower; the notes name the replaced term and the measured rate."""
    fast = _trace(tmp_path / "fast.json.gz", 150.0)      # 916 TFLOP/s
    slow = _trace(tmp_path / "slow.json.gz", 500.0)      # 275 TFLOP/s

    def plan(*extra):
        code, out, err = meshscope(*PLAN, *extra)
        assert code == 0, err
        return json.loads(out)

    base = plan("--device", "H100")
    f, s = plan("--from", fast), plan("--from", slow)
    step = [p["rows"][0]["estimate"]["step_time_us"] for p in (f, base, s)]
    assert step[0] < step[1] < step[2]
    note = next(n for n in f["notes"] if n.startswith("replaced from fast.json.gz"))
    assert f"{FLOPS / 150e-6 / 1e12:.0f} TFLOP/s" in note and "GEMM rate" in note
    assert any("µs of host time a kernel launch" in n for n in s["notes"])


def test_the_corpus_h100_trace_calibrates_a_plan():
    """The corpus' H100 trace (Qwen1.5-0.5B, TraceLens): real bf16 GEMMs at a rate an H100
    can reach, and launches that cost the host microseconds."""
    t = read_trace(shared_trace(H100_TRACE))
    assert "H100" in t.device_name and t.gemm_calls > 10
    tflops = t.gemm_flops / (t.gemm_kernel_us * 1e-6) / 1e12
    assert 100 < tflops < lookup("H100").peak_bf16 / 1e12
    assert 1.0 < t.launch_host_us < 50.0


@pytest.mark.parametrize("case,message", [
    ("not json", "not a readable Kineto trace"),
    ("no shapes", "record_shapes=True"),
    ("other device", "a GEMM rate does not carry across devices"),
    ("runner", "a trace file calibrates a GPU job"),
])
def test_refusals_name_the_trace(tmp_path, case, message):
    path = tmp_path / "t.json"
    args = list(PLAN)
    if case == "not json":
        path.write_text("{ this is not json")
    else:
        _trace(tmp_path / "t.json.gz", 250.0, shapes=case != "no shapes")
        path = tmp_path / "t.json.gz"
    if case == "other device":
        args += ["--device", "A100"]
    if case == "runner":
        args = ["plan", "--world", 8, "--framework", "runner", "--json"]
    code, _, err = meshscope(*args, "--from", path)
    assert code == 2, err
    assert message in err and str(path.name) in err
    assert "Traceback" not in err
