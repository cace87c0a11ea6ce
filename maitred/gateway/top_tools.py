"""Which tool names get a label of their own on ``/metrics``: the N most called, the rest "other".

Tool names come from whatever the events say, so a client sending 10,000 distinct names would
otherwise give ``maitred_tool_duration_seconds`` 10,000 label values (each a set of bucket
series that Prometheus keeps in memory for hours). Here only the ``n`` tools called most often
(``maitred serve --metrics-max-tools``) are labelled; every other call is counted under
``other``, so every call is counted under one label value and ``/metrics`` never holds more
than ``n + 1`` of them.

Counting calls per name must be bounded too: names are counted in a table of
``TABLE_PER_LABEL * n`` names, in the manner of the Space-Saving algorithm (Metwally, Agrawal
and El Abbadi, 2005). When the table is full, the less called half of the names without a label
is forgotten at once, and a name new to the table starts from the highest count forgotten so
far: an over-estimate of its calls, kept as the entry's ``error``. Forgetting in halves, not
one name per new name, keeps a flood of new names at a sort per half table instead of a scan of
the table per call. The labelled names are never forgotten.

A tool counted under ``other`` that later becomes one of the top ``n`` (by calls that are
certain, count less error, so a flood of one-off names never promotes one of them) gets its own
series from then on, starting at zero: the calls it made before stay in ``other``. Moving them
would make ``other`` go backwards, which Prometheus reads as a counter reset and turns into a
spurious spike in ``rate()``. The labelled tool it displaces loses its series (it vanishes from
``/metrics``, which Prometheus marks stale) and its later calls go to ``other``; should it come
back, its new series restarts at zero, which ``rate()`` handles exactly as the counter reset it
is. A challenger must have a quarter more calls than the least called labelled tool
(``PROMOTE_MARGIN``), so two tools with about the same count do not trade places, and series,
back and forth.
"""

from dataclasses import dataclass

#: Tools given a label of their own by default (``maitred serve --metrics-max-tools``).
MAX_TOOLS = 20
#: The label value every tool without a label of its own is counted under.
OTHER = "other"
#: Names counted per labelled name (the Space-Saving table is this many times ``n``).
TABLE_PER_LABEL = 10
#: A tool takes a labelled tool's place once its certain calls exceed that tool's by this factor.
PROMOTE_MARGIN = 1.25


@dataclass(slots=True)
class _Tally:
    count: int  # calls counted (an over-estimate by at most ``error``)
    error: int  # the count it started from: the highest count forgotten before it came

    @property
    def certain(self) -> int:
        return self.count - self.error


@dataclass(frozen=True, slots=True)
class Labelled:
    """What one call is counted under, and a tool whose series is to be removed (displaced)."""

    label: str
    displaced: str | None = None


class TopTools:
    """The ``n`` most called tool names, in bounded memory (see the module docstring)."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"max_tools must be >= 0, got {n!r}")
        self.n = n
        self.size = TABLE_PER_LABEL * n
        self._tallies: dict[str, _Tally] = {}
        self._labelled: set[str] = set()
        self._floor = 0  # the highest count of a name forgotten so far

    def call(self, name: str) -> Labelled:
        """Count one call of ``name`` and say which label it goes under."""
        if self.n == 0 or name == OTHER:  # a tool named "other" is one with the rest
            return Labelled(OTHER)
        tally = self._count(name)
        if name in self._labelled:
            return Labelled(name)
        if len(self._labelled) < self.n:
            self._labelled.add(name)
            return Labelled(name)
        weakest = min(self._labelled, key=lambda t: self._tallies[t].count)
        if tally.certain <= self._tallies[weakest].count * PROMOTE_MARGIN:
            return Labelled(OTHER)
        self._labelled.remove(weakest)
        self._labelled.add(name)
        return Labelled(name, displaced=weakest)

    def _count(self, name: str) -> _Tally:
        tally = self._tallies.get(name)
        if tally is None:
            if len(self._tallies) >= self.size:
                self._forget_half()
            tally = self._tallies[name] = _Tally(self._floor, self._floor)
        tally.count += 1
        return tally

    def _forget_half(self) -> None:
        """Forget the less called half of the names without a label (see the module docstring)."""
        unlabelled = sorted((t for t in self._tallies if t not in self._labelled), key=lambda t: self._tallies[t].count)
        for name in unlabelled[: max(len(unlabelled) // 2, 1)]:
            self._floor = max(self._floor, self._tallies.pop(name).count)
