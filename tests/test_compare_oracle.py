"""compare's oracle by construction (issue 52 item 2, the hand-made part): two runs whose parts
of the step each move by a different known amount at once — compute, exposed pipeline (pp) and
data-parallel (dp) communication, the bubble, other device work and idle time — and compare's
parts, its gate and its text equal what was built. A part read from another's column (pp for
dp, bubble for idle: the mutations of docs/testing.md) reads another amount and fails here.

The runs are report folders written here (summary.json and the breakdown table; the helper of
tests/test_compare_diff.py), two ranks and three steps, each rank's numbers different so that
a mean over ranks is a mean and the step-to-step noise is known: every part varies by the same
±0.1 ms over the steps on both sides, 1.4826 × MAD = 0.148 ms a side."""
from __future__ import annotations

import math

import pytest

from meshscope.analysis.compare import diff, gate, open_side
from test_compare_diff import _report

# ms per step, before → after, for rank 0; rank 1 is 1 ms more in every part on both sides.
BEFORE = {"compute_us": 10.0, "exposed_comm_pp_us": 1.0, "exposed_comm_dp_us": 2.0,
          "bubble_us": 4.0, "other_us": 0.5, "idle": 3.0}
MOVED = {"compute_us": 2.0, "exposed_comm_pp_us": 3.0, "exposed_comm_dp_us": 5.0,
         "bubble_us": 7.0, "other_us": 1.0, "idle": 11.0}
PART = {"compute_us": "compute", "exposed_comm_pp_us": "exposed_comm.pp",
        "exposed_comm_dp_us": "exposed_comm.dp", "bubble_us": "bubble", "other_us": "other",
        "idle": "idle"}
JITTER = (-0.1, 0.0, 0.1)           # the same on every part, step by step


def _steps(parts: dict[str, float], rank_extra: float) -> dict[int, dict[str, float]]:
    """Three steps of ``parts`` (ms) plus ``rank_extra`` on each, the window their sum (the
    helper fills idle as the window's remainder)."""
    out = {}
    for step, j in enumerate(JITTER):
        v = {k: ms + rank_extra + j for k, ms in parts.items()}
        v["window_us"] = sum(v.values())
        v.pop("idle")
        out[step] = v
    return out


def _run(folder, parts):
    """Two ranks of ``parts``: the helper writes every rank the same, so rank 1's extra ms
    is a second report's rows merged in."""
    import pandas as pd

    _report(folder / "r0", _steps(parts, 0.0), ranks=(0,))
    _report(folder / "r1", _steps(parts, 1.0), ranks=(1,))
    both = pd.concat([pd.read_parquet(folder / f"r{r}" / "breakdown.parquet") for r in (0, 1)])
    folder.mkdir(exist_ok=True)
    run = folder / "report"
    _report(run, _steps(parts, 1.0), ranks=(0, 1))     # summary.json: rank 1 the longest
    both.to_parquet(run / "breakdown.parquet")
    return run


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    before = _run(root / "before", BEFORE)
    after = _run(root / "after", {k: BEFORE[k] + MOVED[k] for k in BEFORE})
    return open_side(before), open_side(after)


def test_each_part_moves_by_what_was_built(pair):
    d = diff(*pair)
    parts = {p.name: p for p in d.parts}
    for column, name in PART.items():
        assert parts[name].delta_us == pytest.approx(MOVED[column] * 1e3), name
        # before: the mean of rank 0's and rank 1's (1 ms more) over the steps
        assert parts[name].change.before == pytest.approx((BEFORE[column] + 0.5) * 1e3), name
    assert d.window.delta == pytest.approx(sum(MOVED.values()) * 1e3)
    assert d.residual_us == pytest.approx(0.0, abs=1e-6)
    # every part's noise: 1.4826 × MAD of its per-step means (0.1 ms) on each side
    for name in PART.values():
        assert parts[name].change.noise == pytest.approx(math.hypot(148.26, 148.26)), name


def test_the_gate_judges_each_part_by_its_own_amount(pair):
    """Each part's condition fails 0.5 ms below the amount built into it (the noise: ±0.21
    ms) and does not hold 0.5 ms above it — the amounts are 1 ms or more apart, so a part that
    read another's column crosses one of the two."""
    before, after = pair
    for column, name in PART.items():
        ms = MOVED[column]
        below = gate.evaluate(gate.parse(f"{name}>+{ms - 0.5}ms"),
                              before, after)
        above = gate.evaluate(gate.parse(f"{name}>+{ms + 0.5}ms"),
                              before, after)
        assert below.holds and below.failed, (name, below.message)
        assert not above.holds and not above.failed, (name, above.message)


def test_the_text_ranks_the_parts_by_what_was_built(pair):
    d = diff(*pair)
    # idle (+11 ms) is the largest part, then the bubble (+7), dp (+5), pp (+3), compute (+2)
    order = [p.name for p in sorted(d.parts, key=lambda p: -abs(p.delta_us))
             if abs(p.delta_us) > 0]
    assert order[:5] == ["idle", "bubble", "exposed_comm.dp", "exposed_comm.pp", "compute"]
    assert d.sentences[0].startswith(
        f"Step time rose from {sum(BEFORE.values()) + 1.0 * len(BEFORE):.2f} ms")
