"""Interval arithmetic against a brute-force model on a grid of half-microseconds."""
import random

import numpy as np
import pytest

from meshscope.analysis import intervals as iv


def _points(pairs, res=0.5):
    out = set()
    for s, e in pairs:
        x = s
        while x < e:
            out.add(x)
            x += res
    return out


def _random_set(rng):
    pairs = [(s := rng.randint(0, 60), s + rng.randint(0, 12)) for _ in range(rng.randint(0, 7))]
    return pairs, iv.union([p[0] for p in pairs], [p[1] for p in pairs])


def test_set_operations_match_brute_force():
    rng = random.Random(7)
    for _ in range(400):
        pa, a = _random_set(rng)
        pb, b = _random_set(rng)
        A, B = _points(pa), _points(pb)
        assert _points(a) == A
        assert _points(iv.intersect(a, b)) == A & B
        assert _points(iv.subtract(a, b)) == A - B
        assert _points(iv.merge(a, b)) == A | B
        assert iv.length(a) == len(A) * 0.5


def test_innermost_gives_time_to_the_latest_started_range():
    # An asynchronous send open over [0, 10) while ops run at [1, 2) and [3, 12).
    owned = iv.innermost([0, 1, 3], [10, 2, 12], ["comm", "op", "op"])
    assert owned["op"].tolist() == [[1, 2], [3, 12]]
    assert owned["comm"].tolist() == [[0, 1], [2, 3]]


def test_innermost_nested_call_owns_its_span():
    # A backward op [0, 10) that blocks in an all-reduce [4, 6).
    owned = iv.innermost([0, 4], [10, 6], ["op", "comm"])
    assert owned["op"].tolist() == [[0, 4], [6, 10]]
    assert owned["comm"].tolist() == [[4, 6]]


def test_innermost_matches_the_latest_started_open_range_at_every_point():
    """At each half-microsecond point, found by scanning every range: the one covering it that
    started last (the later-listed of equal starts) owns it; and no label owns a point twice."""
    rng = random.Random(11)
    for _ in range(600):
        n = rng.randint(0, 14)
        starts = [rng.randint(0, 30) for _ in range(n)]
        ends = [s + rng.randint(0, 10) for s in starts]
        labels = [rng.choice("abc") for _ in range(n)]
        owned = iv.innermost(starts, ends, labels)
        expected = {lab: set() for lab in labels}
        for x in (i * 0.5 for i in range(90)):
            covering = [i for i in range(n) if starts[i] <= x < ends[i]]
            if covering:
                last = max(covering, key=lambda i: (starts[i], i))
                expected[labels[last]].add(x)
        assert {lab: _points(v.tolist()) for lab, v in owned.items()} == expected


def test_innermost_on_many_ranges_gives_all_covered_time_once():
    """A lane of 20,000 ranges: the labels' sets are disjoint and together are the union."""
    rng = np.random.default_rng(3)
    starts = np.sort(rng.uniform(0, 1e6, 20_000))
    ends = starts + rng.exponential(40, starts.size)
    owned = iv.innermost(starts, ends, rng.choice(["op", "comm", "recv"], starts.size))
    sets = list(owned.values())
    covered = iv.length(iv.union(starts, ends))
    assert iv.length(iv.merge(*sets)) == pytest.approx(covered, rel=1e-12)
    assert sum(iv.length(x) for x in sets) == pytest.approx(covered, rel=1e-12)


def test_empty_inputs():
    e = iv.union([], [])
    assert e.shape == (0, 2)
    assert iv.length(iv.intersect(e, np.array([[0.0, 1.0]]))) == 0.0
