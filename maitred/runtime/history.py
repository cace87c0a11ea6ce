"""Tool-duration history as online statistics, and the bookkeeping of prediction errors.

Readiness needs, per tool (or per signature such as ``Bash:pytest``), the count, mean, sample
variance and observed range of completed calls; Welford's update keeps those exact in O(1) per
call. A bounded window of recent durations is kept beside them for the one question the moments
cannot answer: "how long do calls that have already run for e seconds usually take?"
"""

import bisect
import functools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol

import numpy as np

RECENT = 256


class StatsRow(Protocol):
    """What seeding needs of ``maitred.storage.ToolStats`` (kept structural: no storage import)."""

    tool: str
    n: int
    mean_s: float
    std_s: float
    min_s: float
    max_s: float


@functools.lru_cache(maxsize=4096)
def t_quantile(confidence: float, dof: int) -> float:
    """Student-t quantile by the Cornish-Fisher expansion around the normal one; within 1% of
    the exact value for dof >= 4, which is all the history rules ever ask for (n >= 5)."""
    z = NormalDist().inv_cdf(confidence)
    v = max(dof, 1)
    return z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v * v)


@dataclass(slots=True)
class DurationStats:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    lo: float = math.inf
    hi: float = -math.inf
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    # Built on demand, dropped by ``add``: the sorted recent durations with suffix sums and the
    # moments of each suffix asked for (a suffix query in O(log n)), and the upper estimate by
    # confidence. A step predicts the end of every open call of a tool from the same few of
    # these, so each is computed once per change of the history instead of once per program.
    _sorted: "_Suffixes | None" = field(default=None, repr=False, compare=False)
    _upper: dict[float, float] = field(default_factory=dict, repr=False, compare=False)

    def add(self, duration: float) -> None:
        self._sorted = None
        self._upper.clear()
        self.n += 1
        delta = duration - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (duration - self.mean)
        self.lo = min(self.lo, duration)
        self.hi = max(self.hi, duration)
        self.recent.append(duration)

    @classmethod
    def seeded(cls, n: int, mean: float, std: float, lo: float, hi: float) -> "DurationStats":
        return cls(n=n, mean=mean, m2=std * std * max(n - 1, 0), lo=lo, hi=hi)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else 0.0

    def upper_estimate(self, confidence: float) -> float:
        """Conservative duration: mean + t·s/√n, clipped to the observed [min, max]."""
        if self.n == 0:
            raise ValueError("no durations recorded")
        upper = self._upper.get(confidence)
        if upper is None:
            bound = self.mean + t_quantile(confidence, self.n - 1) * self.std / math.sqrt(self.n) if self.n > 1 else self.mean
            upper = self._upper[confidence] = min(max(bound, self.lo), self.hi)
        return upper

    def longer_than(self, elapsed: float) -> "DurationStats | None":
        """Moments of the recent calls that ran longer than ``elapsed`` (None when there are none).
        They depend only on how many of those calls there are, so each answer is kept until the
        next ``add`` and handed to every caller alike: read it, never ``add`` to it."""
        if self._sorted is None:
            ordered = np.sort(np.fromiter(self.recent, dtype=float))
            # Suffix sums (ordered[i:].sum()) of values and squares; index len is the empty suffix.
            self._sorted = _Suffixes(
                ordered.tolist(),
                np.append(np.cumsum(ordered[::-1])[::-1], 0.0),
                np.append(np.cumsum((ordered**2)[::-1])[::-1], 0.0),
            )
        table = self._sorted
        i = bisect.bisect_right(table.ordered, elapsed)
        if i not in table.moments:
            table.moments[i] = table.moments_from(i)
        return table.moments[i]


@dataclass(slots=True)
class _Suffixes:
    """The recent durations in order (a list: ``bisect`` on it is far cheaper than numpy's
    search for one value), the sums of each suffix and of its squares, and the moments of the
    suffixes computed so far, by where they start."""

    ordered: list[float]
    sums: np.ndarray
    squares: np.ndarray
    moments: dict[int, DurationStats | None] = field(default_factory=dict)

    def moments_from(self, i: int) -> DurationStats | None:
        n = len(self.ordered) - i
        if n == 0:
            return None
        mean = self.sums[i] / n
        return DurationStats(
            n=n, mean=float(mean), m2=float(max(self.squares[i] - n * mean * mean, 0.0)), lo=self.ordered[i], hi=self.ordered[-1]
        )


@dataclass(frozen=True, slots=True)
class HistoryHit:
    stats: DurationStats
    source: str  # "signature", "tool" or "global"


class ToolHistory:
    """Per-signature, per-tool and global duration statistics.

    ``lookup`` answers are kept until the next ``record`` or ``seed``, the two ways the
    statistics change: a step asks once per open tool call, for a handful of tools."""

    def __init__(self) -> None:
        self.by_signature: dict[str, DurationStats] = {}
        self.by_tool: dict[str, DurationStats] = {}
        self.overall = DurationStats()
        self._hits: dict[tuple[str, str | None, int, bool], HistoryHit | None] = {}

    def record(self, tool: str, signature: str | None, duration: float) -> None:
        self._hits.clear()
        self.by_tool.setdefault(tool, DurationStats()).add(duration)
        if signature:
            self.by_signature.setdefault(signature, DurationStats()).add(duration)
        self.overall.add(duration)

    def seed(self, rows: Iterable[StatsRow], *, signatures: bool = False) -> None:
        """Start from stored history (``SessionStore.tool_stats_all``); the ``*`` row seeds the
        global statistics. Recorded calls then update the seeded moments."""
        self._hits.clear()
        for row in rows:
            stats = DurationStats.seeded(row.n, row.mean_s, row.std_s, row.min_s, row.max_s)
            if row.tool == "*":
                if not signatures:
                    self.overall = stats
            elif signatures:
                self.by_signature[row.tool] = stats
            else:
                self.by_tool[row.tool] = stats

    def lookup(self, tool: str, signature: str | None, min_n: int, *, use_signature: bool = True) -> HistoryHit | None:
        """Signature history when it has ``min_n`` calls, else the tool's, else the global (≥ 2)."""
        key = (tool, signature, min_n, use_signature)
        if key not in self._hits:
            self._hits[key] = self._find(tool, signature, min_n, use_signature)
        return self._hits[key]

    def _find(self, tool: str, signature: str | None, min_n: int, use_signature: bool) -> HistoryHit | None:
        if use_signature and signature:
            stats = self.by_signature.get(signature)
            if stats is not None and stats.n >= min_n:
                return HistoryHit(stats, "signature")
        stats = self.by_tool.get(tool)
        if stats is not None and stats.n >= min_n:
            return HistoryHit(stats, "tool")
        if self.overall.n >= 2:
            return HistoryHit(self.overall, "global")
        return None


@dataclass(slots=True)
class PredictionLog:
    """Error of the readiness prediction in force when each tool call ended (TAO reports MAE
    0.41 s with 82.9% of predictions within 0.5 s)."""

    n: int = 0
    abs_error_sum: float = 0.0
    within_half_second: int = 0

    def record(self, predicted_end: float, actual_end: float) -> None:
        error = abs(predicted_end - actual_end)
        self.n += 1
        self.abs_error_sum += error
        self.within_half_second += error <= 0.5

    @property
    def mae_s(self) -> float | None:
        return self.abs_error_sum / self.n if self.n else None

    @property
    def within_half_second_share(self) -> float | None:
        return self.within_half_second / self.n if self.n else None
