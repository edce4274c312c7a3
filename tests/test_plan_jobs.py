"""A GPU job's plan piece by piece: the device catalogue against vendors' data sheets and
published GEMM sweeps, custom devices, precision per operation, overlap per dimension, the
named memory terms, and a ranking a reviewer can trust (fitting layouts first, a warning when
none fits, ties within the stated uncertainty, full names, --top). Numbers here hold by
construction or come from the publications named; the published jobs are in
test_plan_references.py."""
import dataclasses
import itertools
import json

import pytest

from conftest import ROOT, meshscope
from meshscope.layouts.plan import Candidate, ModelSpec, memory
from meshscope.layouts.plan.devices import CATALOGUE, DeviceError, DeviceSpec, lookup
from meshscope.layouts.plan.job_step import JobOptions, predict_job
from meshscope.layouts.plan.topology import Topology
from meshscope.layouts.plan.traffic import transfers
from meshscope.layouts.plan.training import Training
from meshscope.parallel.layout import parse_layout

MODELS = ROOT / "bench" / "plan_references" / "models"
LLAMA70B = MODELS / "llama-3-70b.json"
L8 = ModelSpec.from_json(MODELS / "llama-3-8b.json", seq_len=8192)
H100 = lookup("H100")


def plan_json(*args):
    return json.loads(meshscope("plan", *args, "--json", check=True).stdout)


# -- the device catalogue -------------------------------------------------------------------

# Dense (no sparsity) peaks from the vendors' data sheets, TFLOP/s: (bf16, fp8), and memory GiB
DATA_SHEETS = {"H100-SXM": (989.4, 1978.9, 80), "H100-PCIe": (756, 1513, 80),
               "H800": (989.4, 1978.9, 80), "H200": (989.4, 1978.9, 131),
               "B200": (2250, 4500, 167), "A100-80GB": (312, None, 80),
               "A100-40GB": (312, None, 40), "MI300X": (1307.4, 2614.9, 192),
               "MI250": (181, None, 64)}


@pytest.mark.parametrize("name", sorted(DATA_SHEETS))
def test_catalogue_device_values_and_their_sources(name):
    dev = CATALOGUE[name]
    bf16, fp8, gib = DATA_SHEETS[name]
    assert dev.peak_bf16 / 1e12 == pytest.approx(bf16, rel=1e-3)
    assert dev.supports("fp8") == (fp8 is not None)
    if fp8:
        assert dev.peak_flops["fp8"] / 1e12 == pytest.approx(fp8, rel=1e-3)
    assert dev.memory_bytes / 2 ** 30 == pytest.approx(gib, abs=1)
    assert dev.memory_achieved_bytes_s <= dev.memory_bytes_s
    for field, value, source in dev.values():
        assert value and source and source != "catalogue", (field, value)


@pytest.mark.parametrize("device,precision,sweep", [
    # Azure AI-benchmarking-guide, cuBLASLt: (M, N, K) products, TFLOP/s
    ("A100-80GB", "bf16", {(4096,) * 3: 228.0, (8192,) * 3: 253.7, (16384,) * 3: 256.5,
                           (6144, 12288, 12288): 250.8, (802816, 192, 768): 157.8}),
    ("H100-SXM", "fp8", {(4096,) * 3: 1216.9, (8192,) * 3: 1290.1, (16384,) * 3: 1377.3,
                         (6144, 12288, 12288): 1351.4, (802816, 192, 768): 663.8}),
    ("H200", "fp8", {(4096,) * 3: 1249.1, (8192,) * 3: 1300.6, (16384,) * 3: 1366.3,
                     (6144, 12288, 12288): 1318.0, (802816, 192, 768): 717.5}),
])
def test_gemm_curves_reproduce_the_published_sweeps(device, precision, sweep):
    """Each curve, timed on the sweep's own products — square ones and the skinny one whose
    low intensity costs it half the rate — gives the published TFLOP/s within 10%."""
    dev = CATALOGUE[device]
    curve, peak = dev.curve(precision), dev.peak_flops[precision]
    for (m, n, k), published in sweep.items():
        us = curve.time_us(m, n, k, peak)
        assert 2 * m * n * k / us / 1e6 == pytest.approx(published, rel=0.10), (m, n, k)


def test_b200_fp8_curve_reproduces_the_gb200_sweep():
    """No B200 sweep is public; the B200's FP8 curve is the GB200's (the same die at a higher
    power limit) as a share of each part's data-sheet peak: at the GB200's 5 PFLOP/s it gives
    Azure's ND GB200 v6 cuBLASLt FP8 TFLOP/s within 10% from 4096³ up and on the skinny
    product."""
    curve = CATALOGUE["B200"].curve("fp8")
    sweep = {(4096,) * 3: 2834.6, (8192,) * 3: 2876.6, (16384,) * 3: 2906.9,
             (32768,) * 3: 2825.6, (6144, 12288, 12288): 2895.6, (802816, 192, 768): 1459.5}
    for (m, n, k), published in sweep.items():
        us = curve.time_us(m, n, k, 5000e12)
        assert 2 * m * n * k / us / 1e6 == pytest.approx(published, rel=0.10), (m, n, k)
    assert "GB200" in curve.source and "no public" in CATALOGUE["B200"].curve("bf16").source


def test_clock_fraction_slows_gemms_and_attention_alike(tmp_path):
    """A power-limited part (clock_fraction) runs its GEMMs and flash attention at that
    fraction and its memory-bound kernels at the memory bandwidth given; gemm_efficiency
    rescales the GEMM curves alone."""
    toml = tmp_path / "capped.toml"
    toml.write_text('base = "H100"\nclock_fraction = 0.75\n')
    capped = DeviceSpec.from_toml(toml)
    assert capped.attention_efficiency == pytest.approx(0.75 * H100.attention_efficiency)
    for p, c in H100.curves.items():
        assert capped.curves[p].eta_max == pytest.approx(0.75 * c.eta_max)
    assert capped.memory_achieved_bytes_s == H100.memory_achieved_bytes_s
    assert str(toml) in capped.source("attention")
    t = Training(framework="megatron", precision="mixed")
    spec, cand = L8, Candidate(parse_layout("dp=8"), microbatches=4, dp_mode="zero1",
                               global_batch=32)
    full = predict_job(spec, cand, t, H100, Topology.for_device(H100))
    slow = predict_job(spec, cand, t, capped, Topology.for_device(capped))
    assert slow.terms["attention_us"] == pytest.approx(full.terms["attention_us"] / 0.75)
    assert slow.terms["memory_bound_us"] == pytest.approx(full.terms["memory_bound_us"])
    toml.write_text('base = "H100"\ngemm_efficiency = 0.6\n')
    gemm_only = DeviceSpec.from_toml(toml)
    assert gemm_only.attention_efficiency == H100.attention_efficiency


def test_device_lookup_by_driver_name():
    assert lookup("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert lookup("NVIDIA H100 PCIe").name == "H100-PCIe"
    assert lookup("NVIDIA A100-SXM4-40GB").name == "A100-40GB"
    assert lookup("AMD Instinct MI300X").name == "MI300X"
    assert lookup("TPU v5p") is None


def test_custom_device_from_toml_and_flags(tmp_path):
    """A TOML device (a base and what differs) or one from flags alone; each value it sets
    says where it came from; a bad field is refused naming it."""
    toml = tmp_path / "h100-500w.toml"
    toml.write_text('name = "H100 at 500 W"\nbase = "H100"\nmemory_gb = 95\n'
                    'memory_tbps = 2.4\nbf16_tflops = 800\n')
    dev = DeviceSpec.from_toml(toml)
    assert dev.name == "H100 at 500 W" and dev.memory_bytes == 95 * 2 ** 30
    assert dev.peak_bf16 == 800e12 and dev.peak_flops["fp8"] == H100.peak_flops["fp8"]
    assert dev.source("peak_bf16") == str(toml) and dev.source("peak_fp8") == \
        H100.source("peak_fp8")
    p = plan_json("--model-json", LLAMA70B, "--world", 64, "--device-file", toml,
                  "--layouts", "dp=8,tp=8", "--global-batch", 64, "--seq-len", 4096,
                  "--microbatches", 4, "--dp-modes", "ddp", "--recompute", "none")
    values = {v["value"]: v for v in p["device"]}
    assert values["memory"]["is"] == "95 GiB" and values["memory"]["source"] == str(toml)
    flags = plan_json("--model-json", LLAMA70B, "--world", 64, "--bf16-tflops", 500,
                      "--device-memory-gb", 48, "--memory-tbps", 1.5, "--layouts",
                      "dp=8,tp=8", "--global-batch", 64, "--seq-len", 4096, "--microbatches", 4, "--dp-modes", "ddp", "--recompute", "none")
    values = {v["value"]: v for v in flags["device"]}
    assert values["peak bf16"] == {"value": "peak bf16", "is": "500 TFLOP/s",
                                   "source": "--bf16-tflops"}
    toml.write_text('base = "H100"\nclock_mhz = 1400\n')
    with pytest.raises(DeviceError, match="field clock_mhz"):
        DeviceSpec.from_toml(toml)
    proc = meshscope("plan", "--model-json", LLAMA70B, "--world", 64, "--device-file", toml)
    assert proc.returncode == 2 and "field clock_mhz" in proc.stderr
    proc = meshscope("plan", "--model-json", LLAMA70B, "--world", 64, "--bf16-tflops", 500)
    assert proc.returncode == 2 and "--device-memory-gb" in proc.stderr


def test_detail_shows_every_device_value_with_its_source():
    out = meshscope("plan", "--model-json", LLAMA70B, "--world", 64, "--device", "H200",
                    "--layouts", "dp=8,tp=8", "--global-batch", 64, "--seq-len", 4096,
                    "--detail", check=True).stdout
    for field, _, source in CATALOGUE["H200"].values():
        assert f"{field}:" in out and f"[{source}]" in out


# -- time ------------------------------------------------------------------------------------

def _predict(spec, layout, t, dev=H100, **kw):
    cand = Candidate(parse_layout(layout), microbatches=kw.pop("m", 4),
                     global_batch=kw.pop("gbs", 32), dp_mode=kw.pop("dp_mode", "zero1"),
                     **kw)
    return predict_job(spec, cand, t, dev, Topology.for_device(dev), JobOptions())


def test_fp8_only_on_the_gemms_that_use_it():
    """fp8 speeds up the GEMMs named in --fp8-ops and nothing else: attention keeps its time,
    the output head its own unless named; MFU stays against the bf16 peak (the same FLOPs a
    token, so MFU moves with tokens/s), and the fp8 FLOP/s are stated apart."""
    bf16 = Training(framework="megatron", precision="mixed")
    fp8 = dataclasses.replace(bf16, precision="fp8")
    a, b = _predict(L8, "dp=8", bf16), _predict(L8, "dp=8", fp8)
    assert b.terms["attention_us"] == pytest.approx(a.terms["attention_us"])
    assert b.terms["gemm_us"] < a.terms["gemm_us"] * 0.8
    assert b.mfu_pct / a.mfu_pct == pytest.approx(b.tokens_per_s / a.tokens_per_s)
    assert not a.fp8_tflops_per_gpu and b.fp8_tflops_per_gpu > 0
    head = _predict(L8, "dp=8", dataclasses.replace(fp8, fp8_ops=fp8.fp8_ops + ("head",)))
    assert head.terms["gemm_us"] < b.terms["gemm_us"]
    assert head.fp8_tflops_per_gpu > b.fp8_tflops_per_gpu
    only_mlp = _predict(L8, "dp=8", dataclasses.replace(fp8, fp8_ops=("fc1", "fc2")))
    assert b.terms["gemm_us"] < only_mlp.terms["gemm_us"] < a.terms["gemm_us"]


def test_overlap_is_a_fraction_per_dimension():
    """--overlap tp=f hides f of tp's communication (what the window allows): 1 hides it all,
    0.5 about half; the styles' defaults differ where the frameworks do (DeepSpeed hides less
    of its data-parallel reduction than Megatron)."""
    spec = ModelSpec.from_json(LLAMA70B, seq_len=4096)
    base = Training(framework="megatron", precision="mixed")
    t0 = _predict(spec, "dp=8,tp=8", dataclasses.replace(base, overlap=(("tp", 0.0),)),
                  gbs=64, m=8)
    t1 = _predict(spec, "dp=8,tp=8", dataclasses.replace(base, overlap=(("tp", 1.0),)),
                  gbs=64, m=8)
    half = _predict(spec, "dp=8,tp=8", dataclasses.replace(base, overlap=(("tp", 0.5),)),
                    gbs=64, m=8)
    # what stays exposed at tp=1 is the optimizer's all-reduce of the norms' gradients
    assert t1.exposed_comm_us["tp"] < t0.exposed_comm_us["tp"] / 100
    assert half.exposed_comm_us["tp"] - t1.exposed_comm_us["tp"] == pytest.approx(
        (t0.exposed_comm_us["tp"] - t1.exposed_comm_us["tp"]) / 2, rel=0.01)
    ds = dataclasses.replace(base, framework="deepspeed")
    assert ds.job_style == "deepspeed" and ds.overlap_of("dp") < base.overlap_of("dp")
    fsdp = Training(framework="torch", precision="mixed")
    assert fsdp.job_style == "fsdp" and not fsdp.fused_kernels and base.fused_kernels


def test_megatron_hides_the_column_parallel_input_gradients_behind_their_weight_gradients():
    """Megatron-Core runs the backward collective of a column-parallel linear's input
    gradient (QKV's, the MLP's first) asynchronously beside its weight-gradient GEMM: of
    each layer's four activation all-reduces (no sequence parallelism) two are hidden, of
    its four reduce-scatters (with it) two, so about half, resp. a quarter, of tp's
    microbatch communication. --overlap tp=0 given, a torch (FSDP) job and a window too
    short for them hide none of it."""
    spec = ModelSpec.from_json(LLAMA70B, seq_len=4096)
    base = Training(framework="megatron", precision="mixed")
    none = dataclasses.replace(base, overlap=(("tp", 0.0),))
    for sp, share in ((False, 0.5), (True, 0.25)):
        d = _predict(spec, "dp=8,tp=8", base, gbs=64, m=8, sp=sp)
        z = _predict(spec, "dp=8,tp=8", none, gbs=64, m=8, sp=sp)
        hidden = 1 - d.exposed_comm_us["tp"] / z.exposed_comm_us["tp"]
        # the first and last stage's extra collectives (embedding, head) and the norms'
        # gradient all-reduce are not of the kind: a little under the share
        assert share * 0.9 < hidden < share
    torch = Training(framework="torch", precision="mixed")
    assert _predict(spec, "dp=8,tp=8", torch, gbs=64, m=8).exposed_comm_us["tp"] == \
        pytest.approx(_predict(spec, "dp=8,tp=8",
                               dataclasses.replace(torch, overlap=(("tp", 0.0),)), gbs=64,
                               m=8).exposed_comm_us["tp"])


def test_megatron_interleaved_sends_stay_hidden_with_another_dimension_overlap_given():
    """Megatron overlaps the interleaved schedule's pipeline sends (overlap_p2p_comm); an
    --overlap given for tp alone leaves that as it is; --overlap pp=0 shows them."""
    spec = ModelSpec.from_json(LLAMA70B, seq_len=4096)
    t = Training(framework="megatron", precision="mixed", overlap=(("tp", 1.0),))
    kw = dict(gbs=64, m=16, schedule="interleaved-1f1b", virtual=2)
    hidden = _predict(spec, "dp=2,tp=4,pp=8", t, **kw)
    shown = _predict(spec, "dp=2,tp=4,pp=8",
                     dataclasses.replace(t, overlap=(("tp", 1.0), ("pp", 0.0))), **kw)
    assert hidden.exposed_comm_us["pp"] == 0.0 < shown.exposed_comm_us["pp"]


def test_megatron_interleaved_reduces_each_model_chunk_behind_the_others():
    """Megatron's interleaved schedule starts a model chunk's gradient reduction once its
    last microbatch is back and gathers its weights before its first forward: the chunks
    other than the last hide behind the other chunks' passes, so less of the distributed
    optimizer's traffic shows than with one stage a rank (1F1B), where only the last
    microbatch's backward hides it; with --overlap dp=0 all of it shows in both."""
    spec = ModelSpec.from_json(LLAMA70B, seq_len=4096)
    t = Training(framework="megatron", precision="mixed")
    kw = dict(gbs=32, m=8)      # dp across nodes (tp fills them), few microbatches
    lay = "dp=4,tp=8,pp=4"
    inter = _predict(spec, lay, t, schedule="interleaved-1f1b", virtual=5, **kw)
    plain = _predict(spec, lay, t, schedule="1f1b", **kw)
    assert 0 < inter.exposed_comm_us["dp"] < plain.exposed_comm_us["dp"] / 2
    off = dataclasses.replace(t, overlap=(("dp", 0.0),))
    inter_off = _predict(spec, lay, off, schedule="interleaved-1f1b", virtual=5, **kw)
    plain_off = _predict(spec, lay, off, schedule="1f1b", **kw)
    assert inter_off.exposed_comm_us["dp"] == pytest.approx(plain_off.exposed_comm_us["dp"],
                                                            rel=0.01)


def test_torchtitan_float8_tensor_parallelism_gathers_the_forward_in_float8():
    """torchtitan's Float8 TP casts before the sequence-parallel all-gathers into attention
    and the FFN: a torch fp8 job's forward gathers move one byte an element, so its tp
    all-gathers send a little over 3/4 of its bf16 twin's bytes (the backward's and the
    head's stay 16-bit) and the reduce-scatters the same; full recomputation repeats the
    float8 gathers. A Megatron fp8 job (not claimed) gathers in 16 bits."""
    cand = Candidate(parse_layout("dp=8,tp=8"), microbatches=1, global_batch=8,
                     dp_mode="fsdp")

    def tp_bytes(t, op):
        return sum(x.bytes for x in transfers(L8, cand, training=t)
                   if x.dim == "tp" and x.op == op and x.phase == "microbatch")

    for recompute in ("none", "full"):
        bf16 = Training(framework="torch", precision="mixed", recompute=recompute)
        fp8 = dataclasses.replace(bf16, precision="fp8")
        ratio = tp_bytes(fp8, "all_gather") / tp_bytes(bf16, "all_gather")
        assert 0.75 < ratio < 0.8 if recompute == "none" else 0.66 < ratio < 0.7
        assert tp_bytes(fp8, "reduce_scatter") == tp_bytes(bf16, "reduce_scatter")
    meg = Training(framework="megatron", precision="mixed")
    assert tp_bytes(dataclasses.replace(meg, precision="fp8"), "all_gather") == \
        tp_bytes(meg, "all_gather")


def test_torch_context_parallel_gathers_the_query_heads_k_v_once_a_pass():
    """torch's ring attention as torchtitan runs it: K, V repeated to the query heads
    (Llama 3 8B: 32 heads, 8 key/value heads; tp 2 keeps 16) and all-gathered once a layer's
    forward and once its backward (torch's default ALL_GATHER rotation), full recomputation
    gathering once more; dK, dV passed on in fp32 at each of the cp steps. A microbatch of 1
    sequence of 8192 tokens on cp 4: 2048 tokens a rank, K and V of 128 each at 2 bytes. With
    ample attention to hide behind, all of it hides but each layer's last dK, dV (waited for
    after the ring's loop): 1/cp of those sends; with none, nothing hides. Megatron's ring
    (not claimed) keeps its sends of the key/value heads. Memory: the ring's buffers beside a
    layer's attention backward."""
    from meshscope.layouts.plan.job_step import _torch_ring_hidden_us
    cand = Candidate(parse_layout("dp=2,cp=4,tp=2"), microbatches=2, global_batch=4,
                     dp_mode="fsdp")
    kv = 1 * 16 * 2048 * (128 + 128) * 2               # one rank's K and V, query heads
    layers_mb = L8.n_layers * 2                           # a step: 32 layers, 2 microbatches
    topo = Topology.for_device(H100)
    for recompute, forwards in (("none", 1), ("full", 2)):
        t = Training(framework="torch", precision="mixed", recompute=recompute)
        rows = [x for x in transfers(L8, cand, training=t) if x.dim == "cp" and x.pp_rank == 0]
        gathers = sorted((x.count, x.msg_bytes) for x in rows if x.op == "all_gather")
        assert gathers == sorted([(forwards * layers_mb, 4 * kv), (layers_mb, 4 * kv)])
        (sends,) = [x for x in rows if x.op == "send"]
        assert (sends.count, sends.msg_bytes) == (4 * layers_mb, 2 * kv)
        assert _torch_ring_hidden_us(cand, topo, rows, 0.0, 1.0) == 0.0
        per_mb = sum(topo.comm_for(cand, "cp", x.op).time_us(x.op, 4, x.msg_bytes) * x.count
                     for x in rows) / 2
        last = topo.comm_for(cand, "cp", "send").time_us("send", 4, sends.msg_bytes) \
            * sends.count / 4 / 2
        assert _torch_ring_hidden_us(cand, topo, rows, 1e12, 1.0) == pytest.approx(
            per_mb - last)
    meg_t = Training(framework="megatron", precision="mixed")
    meg = [x for x in transfers(L8, cand, training=meg_t) if x.dim == "cp"]
    assert {x.op for x in meg} == {"send", "recv"}
    # beside a layer's attention backward the ring holds every rank's K, V (4 kv), fp32 dQ,
    # dK, dV (dQ is half of K and V: 4·(kv/4 + kv/2)) and the fp32 dK, dV sent and received
    # (2 · 2 kv): 11 kv; Megatron's ring (not claimed) none of it
    torch_t = Training(framework="torch", precision="mixed")
    assert memory(L8, cand, training=torch_t)[0].terms["cp_ring_buffers"] == \
        pytest.approx(11 * kv)
    assert "cp_ring_buffers" not in memory(L8, cand, training=meg_t)[0].terms


def test_fsdp_under_torch_pipelining_reduces_after_the_stage_backward():
    """torch's pipelining runs a FSDP stage's backwards without gradient sync and reduces
    after the last one (``run_post_backward``): a torch FSDP job with a pipeline exposes its
    whole gradient reduce-scatter. DDP under the same pipelining syncs during the last
    backward (its hooks fire), and Megatron's distributed optimizer reduces behind the last
    microbatch's backward (neither claimed): both hide most of theirs."""
    topo = Topology.for_device(H100)

    def reduce_and_exposed(layout, framework, dp_mode):
        cand = Candidate(parse_layout(layout), microbatches=4, global_batch=8, dp_mode=dp_mode)
        t = Training(framework=framework, precision="mixed")
        rows = [x for x in transfers(L8, cand, training=t)
                if x.dim == "dp" and x.op in ("reduce_scatter", "all_reduce")]
        reduce_us = max(sum(topo.comm_for(cand, "dp", x.op).time_us(x.op, x.group_size,
                                                                    x.msg_bytes) * x.count
                            for x in rows if x.pp_rank == r) for r in range(cand.pp))
        est = predict_job(L8, cand, t, H100, topo)
        return reduce_us, est.exposed_comm_us.get("dp", 0.0)

    reduce_us, exposed = reduce_and_exposed("dp=2,pp=2", "torch", "fsdp")
    assert exposed >= reduce_us > 0
    for framework, mode in (("torch", "ddp"), ("megatron", "zero1")):
        reduce_us, exposed = reduce_and_exposed("dp=2,pp=2", framework, mode)
        assert exposed < 0.5 * reduce_us


def test_distributed_optimizer_gathers_are_hidden_behind_the_forward():
    """Megatron's overlap-grad-reduce and overlap-param-gather hide ZeRO-1's gradient
    reduce-scatter behind the backward and its weight all-gather behind the next forward: 8B
    on one node (NVLink), where both take far less than the compute, leaves about one bucket
    exposed; without overlap both show whole."""
    t = Training(framework="megatron", precision="mixed")
    hidden = _predict(L8, "dp=8", t, gbs=16, m=1)
    shown = _predict(L8, "dp=8", dataclasses.replace(t, overlap=(("dp", 0.0),)), gbs=16, m=1)
    assert hidden.exposed_comm_us["dp"] < shown.exposed_comm_us["dp"] / 10


# -- memory ----------------------------------------------------------------------------------

def _peak_terms(spec, layout, t, **kw):
    cand = Candidate(parse_layout(layout), microbatches=kw.pop("m", 1),
                     global_batch=kw.pop("gbs", 16), dp_mode=kw.pop("dp_mode", "fsdp"), **kw)
    return max(memory(spec, cand, training=t), key=lambda e: e.total_bytes).terms


def test_memory_terms_as_frameworks_allocate():
    fsdp = Training(framework="torch", precision="mixed", recompute="op")
    terms = _peak_terms(L8, "dp=8", fsdp)
    for name in ("fsdp_unsharded_params", "fsdp_unsharded_grads", "logits_loss",
                 "activations", "recompute_working_set", "allocator_reserve"):
        assert terms[name] > 0, name
    # one more layer gathered ahead: one more layer's 16-bit weights
    ahead = _peak_terms(L8, "dp=8", dataclasses.replace(fsdp, fsdp_prefetch=2))
    layer = sum(p.numel for p in L8.layer_params(0))
    assert ahead["fsdp_unsharded_params"] - terms["fsdp_unsharded_params"] == \
        pytest.approx(2 * layer)
    # the allocator's reserve is the stated fraction of everything else
    more = _peak_terms(L8, "dp=8", dataclasses.replace(fsdp, allocator_reserve=0.2))
    rest = sum(v for k, v in more.items() if k != "allocator_reserve")
    assert more["allocator_reserve"] == pytest.approx(0.2 * rest)
    # bf16 optimizer states: half the fp32 moments
    bf16 = _peak_terms(L8, "dp=8", dataclasses.replace(fsdp, optimizer_states="bf16"))
    assert bf16["adam_state_bf16"] == pytest.approx(terms["adam_state_fp32"] / 2)
    # with a pipeline FSDP keeps the stage gathered and accumulates fp32 gradients
    pp = _peak_terms(L8, "dp=4,pp=2", fsdp, m=4)
    assert pp["fsdp_unsharded_grads"] == pytest.approx(2 * pp["fsdp_unsharded_params"])
    # DeepSpeed's communication buckets (reduce_bucket_size, allgather_bucket_size: 5e8 each)
    ds = _peak_terms(L8, "dp=8", Training(framework="deepspeed", precision="mixed"),
                     dp_mode="zero1")
    assert ds["deepspeed_reduce_bucket"] == ds["deepspeed_allgather_bucket"] == 1e9


def test_deepspeed_bf16_optimizer_keeps_whole_fp32_gradients():
    """bf16 + ZeRO-1 under DeepSpeed is its BF16_Optimizer (engine._do_optimizer_sanity_check):
    the fp32 gradient accumulation buffer is whole on every rank and all-reduced; ZeRO-2 keeps
    the partitioned fp32 gradients and reduce-scatters."""
    from meshscope.layouts.plan.traffic import transfers
    ds = Training(framework="deepspeed", precision="mixed")
    z1 = _peak_terms(L8, "dp=8", ds, dp_mode="zero1")
    z2 = _peak_terms(L8, "dp=8", ds, dp_mode="zero2")
    assert "grads_fp32_partition" not in z1 and "grads_fp32_accumulation" not in z2
    assert z1["grads_fp32_accumulation"] == pytest.approx(8 * z2["grads_fp32_partition"])
    assert z1["grads_fp32_accumulation"] == pytest.approx(2 * z1["weights_16bit"])
    ops = {}
    for mode in ("zero1", "zero2"):
        cand = Candidate(parse_layout("dp=8"), microbatches=1, global_batch=8, dp_mode=mode)
        ops[mode] = {x.op for x in transfers(L8, cand, training=ds) if x.dim == "dp"}
    assert "all_reduce" in ops["zero1"] and "reduce_scatter" not in ops["zero1"]
    assert "reduce_scatter" in ops["zero2"]


def test_moe_capacity_factor_and_dispatch_buffers():
    mix = ModelSpec.from_json(MODELS / "mixtral-8x7b.json", seq_len=4096)
    t = Training(framework="megatron", precision="mixed")
    dropless = _peak_terms(mix, "dp=8,ep=8", t, dp_mode="zero1")
    padded = _peak_terms(mix, "dp=8,ep=8", dataclasses.replace(t, capacity_factor=1.25),
                         dp_mode="zero1")
    assert padded["moe_dispatch_buffers"] == pytest.approx(
        1.25 * dropless["moe_dispatch_buffers"])
    assert padded["activations"] > dropless["activations"]
    proc = meshscope("plan", "--model-json", MODELS / "mixtral-8x7b.json", "--world", 8,
                     "--capacity-factor", 0.5)
    assert proc.returncode == 2 and "--capacity-factor 0.5" in proc.stderr


def _moe(experts, top_k, **kw):
    return ModelSpec(dim=64, n_layers=2, n_heads=4, ffn_hidden=128, vocab_size=256, seq_len=64,
                     moe_experts=experts, moe_top_k=top_k, **kw)


def test_moe_dispatch_copies_against_an_enumeration_of_routes():
    """The copies of a token a dispatch sends over the network and over NVLink, against every
    route enumerated: 16 experts on 16 ranks in two nodes of 8, top-2. An NCCL all-to-all
    sends each routed copy to another node when its expert is there (k · 8/16 = 1); DeepEP
    sends one copy to the other node when any of the token's experts is there."""
    from meshscope.layouts.plan.moe_dispatch import Dispatch
    spec = _moe(16, 2)
    routes = list(itertools.combinations(range(16), 2))          # the token's two experts
    other = [e for e in range(16) if e >= 8]                     # the other node's experts
    reach = sum(any(e in other for e in r) for r in routes) / len(routes)
    copies = sum(sum(e in other for e in r) for r in routes) / len(routes)
    a2a = Dispatch.of(spec, 16, 8, "alltoall", "uniform")
    deep = Dispatch.of(spec, 16, 8, "deepep", "uniform")
    assert a2a.network_copies == pytest.approx(copies) == pytest.approx(1.0)
    assert deep.network_copies == pytest.approx(reach)           # 92/120
    assert deep.network_copies < a2a.network_copies
    # in one node nothing crosses the network, whichever the dispatcher
    for d in ("alltoall", "deepep"):
        one = Dispatch.of(spec, 8, 8, d, "uniform")
        assert one.network_copies == 0 and one.nvlink_copies == pytest.approx(2 * 7 / 8)


def test_group_limited_routing_reaches_fewer_nodes():
    """DeepSeek-V3's router picks its 8 experts inside 4 of 8 expert groups; with EP64 over 8
    nodes each node holds one group, so a token reaches 4 nodes: of them 4 · 7/8 are another
    node (every choice of 4 groups enumerated), where uniform routing reaches more."""
    from meshscope.layouts.plan.moe_dispatch import Dispatch
    ds = ModelSpec.from_json(MODELS / "deepseek-v3.json", seq_len=4096)
    choices = list(itertools.combinations(range(8), 4))          # the token's groups
    remote = sum(sum(g != 0 for g in c) for c in choices) / len(choices)   # own node: 0
    limited = Dispatch.of(ds, 64, 8, "deepep", "model")
    assert limited.network_copies == pytest.approx(remote) == pytest.approx(3.5)
    uniform = Dispatch.of(ds, 64, 8, "deepep", "uniform")
    assert uniform.network_copies > limited.network_copies
    assert Dispatch.of(ds, 64, 8, "alltoall", "model").network_copies == pytest.approx(7.0)


def test_moe_step_terms_are_named_parts_of_the_step():
    """A MoE step names its experts' GEMMs, the router's and the tokens' permutation — parts of
    gemm_us and memory_bound_us; the permutation moves k copies of each token, so twice the
    experts a token goes to move twice its bytes, and a dense model has none of the three."""
    t = Training(framework="megatron", precision="mixed")
    cand = Candidate(parse_layout("dp=8,ep=8"), microbatches=4, dp_mode="zero1",
                     global_batch=32)
    dev = CATALOGUE["H100-SXM"]

    def terms(spec):
        return predict_job(spec, cand, t, dev, Topology.for_device(dev)).terms

    q = ModelSpec.from_json(MODELS / "qwen3-30b-a3b.json", seq_len=4096)
    a = terms(q)
    assert 0 < a["expert_gemm_us"] + a["router_gemm_us"] < a["gemm_us"]
    assert 0 < a["moe_permute_us"] < a["memory_bound_us"]
    b = terms(dataclasses.replace(q, moe_top_k=16))
    assert b["moe_permute_us"] == pytest.approx(2 * a["moe_permute_us"])
    assert b["expert_gemm_us"] > a["expert_gemm_us"]
    assert "moe_permute_us" not in terms(L8) and "expert_gemm_us" not in terms(L8)


def test_deepep_dispatch_is_faster_only_across_nodes():
    """plan --ep-dispatcher deepep: with the experts on 64 GPUs (8 nodes) the all-to-alls
    move fewer bytes over the network than NCCL's; inside one node the two are the same.
    The copies are shown as terms."""
    common = ("--model-json", MODELS / "deepseek-v3.json", "--seq-len", 4096,
              "--framework", "torch", "--device", "H100", "--recompute", "full",
              "--moe-routing", "uniform", "--microbatches", 4, "--dp-modes", "ddp")

    def run(world, layout, gbs, dispatcher):
        p = plan_json(*common, "--world", world, "--layouts", layout, "--global-batch", gbs,
                      "--ep-dispatcher", dispatcher)
        return p["rows"][0]["estimate"]

    a2a = run(1024, "dp=256,pp=4,ep=64", 2048, "alltoall")
    deep = run(1024, "dp=256,pp=4,ep=64", 2048, "deepep")
    assert deep["exposed_comm_us"]["ep"] < a2a["exposed_comm_us"]["ep"]
    assert deep["terms"]["ep_network_copies"] < a2a["terms"]["ep_network_copies"] == 7.0
    one_a = run(128, "dp=32,pp=4,ep=8", 256, "alltoall")
    one_d = run(128, "dp=32,pp=4,ep=8", 256, "deepep")
    assert one_a["step_time_us"] == pytest.approx(one_d["step_time_us"])
    assert one_a["terms"]["ep_network_copies"] == 0


# -- the ranking ----------------------------------------------------------------------------

def test_ranking_fitting_first_with_ties_full_names_and_top():
    common = ("--model-json", LLAMA70B, "--world", 64, "--seq-len", 8192, "--global-batch",
              128, "--micro-batch-size", 1, "--dp-modes", "zero1", "--schedules",
              "1f1b,interleaved-1f1b", "--precision", "fp8", "--device", "H100",
              "--recompute", "none")        # every knob pinned: every layout, ranked
    p = plan_json(*common)
    rows = p["rows"]
    fits = [r["fits"] for r in rows]
    assert fits == sorted(fits, reverse=True)             # every fitting layout first
    assert p["uncertainty"] and p["uncertainty_source"]
    best = next(r for r in rows if r["fits"])["estimate"]["step_time_us"]
    for r in rows:
        within = r["fits"] and r["estimate"]["step_time_us"] <= best * (1 + p["uncertainty"])
        assert r["tie"] == within
    assert 1 <= sum(r["tie"] for r in rows) < len(rows)
    for r in rows:                                          # the microbatch size honoured
        c = r["candidate"]
        assert c["microbatches"] * c["sizes"]["dp"] == 128
    text = meshscope("plan", *common, check=True).stdout
    for r in rows:
        assert f" {r['name']} " in text                    # never cut
    assert text.count("≈") >= sum(r["tie"] for r in rows)
    top = meshscope("plan", *common, "--top", 3, check=True).stdout
    assert f"({len(rows) - 3} more layouts not shown: --top)" in top
    assert rows[3]["name"] not in top and rows[0]["name"] in top


def test_explicit_layouts_take_their_microbatches_from_the_microbatch_size():
    """--layouts with --micro-batch-size: each layout's microbatches follow from its own dp
    (global batch / (dp × size)), not every divisor of the batch."""
    p = plan_json("--model-json", LLAMA70B, "--world", 64, "--seq-len", 8192,
                  "--global-batch", 128, "--micro-batch-size", 1, "--dp-modes", "zero1",
                  "--schedules", "interleaved-1f1b", "--virtual-stages", 5, "--precision",
                  "fp8", "--device", "H100", "--layouts", "dp=2,tp=4,pp=8;dp=4,tp=8,pp=2",
                  "--recompute", "none")
    got = {r["name"]: r["candidate"]["microbatches"] for r in p["rows"]}
    assert got == {"dp2-tp4-pp8-zero1-interleaved-1f1b-v5-mb64": 64,
                   "dp4-tp8-pp2-zero1-interleaved-1f1b-v5-mb32": 32}
    proc = meshscope("plan", "--model-json", LLAMA70B, "--world", 64, "--seq-len", 8192,
                     "--global-batch", 128, "--micro-batch-size", 3, "--layouts", "dp=2,tp=32")
    assert proc.returncode == 2 and "--micro-batch-size 3" in proc.stderr


def test_eager_kernels_are_slower_than_fused_ones():
    """--eager-kernels: PyTorch's eager norms and activations move EAGER_ELEMENTWISE × the
    bytes of fused kernels; the fsdp style's default is eager, --fused-kernels (compile)."""
    args = ("--model-json", MODELS / "llama-3-8b.json", "--world", 8, "--seq-len", 8192,
            "--global-batch", 8, "--micro-batch-size", 1, "--style", "fsdp", "--dp-modes",
            "fsdp", "--device", "H100", "--layouts", "dp=8")
    step = {k: plan_json(*args, *k)["rows"][0]["estimate"]["terms"]["memory_bound_us"]
            for k in ((), ("--fused-kernels",), ("--eager-kernels",))}
    assert step[()] == step[("--eager-kernels",)] > step[("--fused-kernels",)]


def test_a_warning_when_no_layout_fits():
    """70B on 8 H100s: nothing fits; the plan says so before its table (and on stderr with
    --json) and still ranks the layouts by their predicted step."""
    args = ("--model-json", LLAMA70B, "--world", 8, "--seq-len", 4096, "--global-batch", 8,
            "--device", "H100")
    text = meshscope("plan", *args, check=True).stdout
    assert "WARNING: no layout fits the device's memory" in text
    proc = meshscope("plan", *args, "--json", check=True)
    assert "no layout fits" in proc.stderr
    assert all(r["fits"] is False for r in json.loads(proc.stdout)["rows"])
