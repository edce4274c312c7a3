"""Remedies by what made the memory (issue 48, item 3), on traces made for the test: a small
attention block profiled on CPU with ``profile_memory=True`` — unfused (``q @ kᵀ``, softmax,
``@ v``: the scores, [batch × heads, seq, seq], materialised) and fused
(``scaled_dot_product_attention``) — analysed as a user would. The unfused one's largest
allocator is the scores, and its remedy is fused attention; the fused twin holds no scores and
gets no such remedy. Severity is relative to the device's memory where it is given."""
from __future__ import annotations

import gzip
import json

import pytest

from conftest import meshscope

MAKE = """
import sys, torch, torch.nn as nn, torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity, schedule
torch.manual_seed(0)
FUSED = sys.argv[2] == "fused"
class Attention(nn.Module):
    def __init__(s, d=64, h=8):
        super().__init__(); s.h = h; s.qkv = nn.Linear(d, 3 * d); s.o = nn.Linear(d, d)
    def forward(s, x):
        B, S, D = x.shape
        q, k, v = s.qkv(x).reshape(B, S, 3, s.h, D // s.h).permute(2, 0, 3, 1, 4)
        if FUSED:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            y = ((q @ k.transpose(-1, -2)) / (D // s.h) ** 0.5).softmax(-1) @ v
        return s.o(y.transpose(1, 2).reshape(B, S, D))
m = nn.Sequential(Attention(), nn.Linear(64, 64))
x = torch.randn(2, 512, 64)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
             schedule=schedule(wait=0, warmup=1, active=2),
             on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as p:
    for _ in range(3):
        m(x).sum().backward(); p.step()
"""


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("attention")
    (root / "make.py").write_text(MAKE)
    out = {}
    for kind in ("unfused", "fused"):
        folder = root / kind
        folder.mkdir()
        raw = folder / "rank0.json"
        proc = subprocess.run([sys.executable, str(root / "make.py"), str(raw), kind],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        (folder / "rank0.json.gz").write_bytes(gzip.compress(raw.read_bytes()))
        raw.unlink()
        out[kind] = folder
    return out


def _findings(folder, *args) -> list[dict]:
    proc = meshscope("analyze", folder, "--json", "--no-cache", *args)
    assert proc.returncode == 0, proc.stderr[-1500:]
    return json.loads(proc.stdout)["findings"]


def test_unfused_attention_scores_get_fused_attention_as_their_remedy(traces):
    (f,) = [f for f in _findings(traces["unfused"]) if f["id"] == "largest-allocator"]
    assert f["evidence"]["operator"] in ("aten::bmm", "aten::_softmax", "aten::softmax",
                                         "aten::_softmax_backward_data")
    assert "scaled_dot_product_attention" in f["remedy"] and "in nan" not in f["title"]
    # the scores of one step: 2 × 8 heads × 512 × 512 float32 = 16 MiB, at least
    assert f["evidence"]["bytes"] >= 2 * 8 * 512 * 512 * 4
    assert f["evidence"]["severity_of"].startswith("the peak")


def test_fused_attention_holds_no_scores_and_gets_no_such_remedy(traces):
    found = _findings(traces["fused"])
    assert not [f for f in found if "scaled_dot_product_attention" in f["remedy"]], found


def test_severity_is_relative_to_the_devices_memory_when_given(traces):
    """The same 16 MiB of scores: [high] against a 49 MiB peak, [low] on a device of 80 GiB."""
    (f,) = [f for f in _findings(traces["unfused"], "--device-memory", "80GiB")
            if f["id"] == "largest-allocator"]
    assert f["severity"] == "low" and f["evidence"]["severity_of"] == "the device's memory"
