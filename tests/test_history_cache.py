"""``DurationStats`` keeps its suffix moments and upper estimates until the next ``add``: they
must equal what a fresh computation gives, before and after more durations come in."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maitred.runtime.history import DurationStats

durations = st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=1, max_size=300)


def fresh_longer_than(stats: DurationStats, elapsed: float) -> tuple[int, float, float, float, float] | None:
    ordered = np.sort(np.fromiter(stats.recent, dtype=float))
    sums = np.append(np.cumsum(ordered[::-1])[::-1], 0.0)
    squares = np.append(np.cumsum((ordered**2)[::-1])[::-1], 0.0)
    i = int(np.searchsorted(ordered, elapsed, side="right"))
    n = len(ordered) - i
    if n == 0:
        return None
    mean = sums[i] / n
    return n, float(mean), float(max(squares[i] - n * mean * mean, 0.0)), float(ordered[i]), float(ordered[-1])


def moments(s: DurationStats | None) -> tuple[int, float, float, float, float] | None:
    return None if s is None else (s.n, s.mean, s.m2, s.lo, s.hi)


def fresh_upper(s: DurationStats, confidence: float) -> float:
    copy = DurationStats(n=s.n, mean=s.mean, m2=s.m2, lo=s.lo, hi=s.hi)
    return copy.upper_estimate(confidence)


@settings(max_examples=200, deadline=None)
@given(durations, durations, st.lists(st.floats(min_value=-1.0, max_value=2e4, allow_nan=False), min_size=1, max_size=10))
def test_kept_answers_match_fresh_ones_across_adds(first: list[float], later: list[float], asked: list[float]) -> None:
    stats = DurationStats()
    for batch in (first, later):
        for d in batch:
            stats.add(d)
        for elapsed in asked * 2:  # the second round is answered from what was kept
            assert moments(stats.longer_than(elapsed)) == fresh_longer_than(stats, elapsed)
            for confidence in (0.9, 0.95):
                kept = stats.upper_estimate(confidence)
                assert kept == fresh_upper(stats, confidence) and math.isfinite(kept)
