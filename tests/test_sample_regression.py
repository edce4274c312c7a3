"""A CHANGE ALARM, not a correctness test (issue 23 item 6; named so by issue 52): each sample
analysed afresh by ``meshscope analyze --no-cache`` equals its committed ``samples/*/report`` —
every table, every summary field (but the time it was generated). The committed reports were
written by this same code, so this detects change, never wrongness: a change of behaviour shows
here as a diff, and the samples' reports are then regenerated on purpose (``meshscope analyze
--no-cache samples/X``; never ``samples/regenerate.sh``, which retrains) and committed with it.
Whether the samples' numbers are right is held elsewhere, against scans of the raw traces
written in the test (tests/test_samples_against_raw_traces.py; docs/testing.md)."""
from __future__ import annotations

import json
import pathlib

import pandas as pd
import pytest

from conftest import meshscope

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = sorted(p.name for p in (ROOT / "samples").iterdir()
                 if (p / "report" / "summary.json").is_file())


def _diff(a, b, path="") -> list[str]:
    """Where two JSON values differ (floats to 1e-9 relative)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in {'fresh' if k in a else 'committed'}"
               for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return [] if a == pytest.approx(b, rel=1e-9, abs=1e-9) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize("sample", SAMPLES)
def test_a_fresh_analysis_equals_the_committed_report(sample, tmp_path):
    committed = ROOT / "samples" / sample / "report"
    fresh = tmp_path / "report"
    meshscope("analyze", "--no-cache", f"samples/{sample}", "--out", fresh, check=True)
    tables = sorted(p.name for p in committed.glob("*.parquet"))
    assert tables == sorted(p.name for p in fresh.glob("*.parquet"))
    for name in tables:
        want, got = pd.read_parquet(committed / name), pd.read_parquet(fresh / name)
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-9, atol=1e-9,
                                      obj=f"{sample}/{name}")
    want = json.loads((committed / "summary.json").read_text())
    got = json.loads((fresh / "summary.json").read_text())
    for s in (want, got):
        s.pop("generated")
    assert _diff(got, want) == [], f"{sample}: regenerate with meshscope analyze --no-cache"
