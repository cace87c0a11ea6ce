"""Every program's idleness in one pass of numpy, for a view of a snapshot.

``signals.idleness`` adds up each program's last cycles, tuples of floats spread over the heap:
at 10,000 programs reading them is most of a view's time (``benchmarks/bench_scheduler.py``),
though only the programs changed since the previous snapshot, a few hundred, have new ones.
So ``RuntimeState.snapshot`` writes a program's inputs (the open cycle, the closed cycles that
count, newest first) as a row of one float table when it copies the program, and a view adds
the columns for all rows at once. It adds the same numbers in the same order as ``idleness``
(numpy's float64 arithmetic is the IEEE double arithmetic Python's floats use), so each result
is the same float, bit for bit; ``tests/test_idleness_table.py`` checks that.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import islice

import numpy as np

from maitred.runtime.records import Phase, ProgramState

# Columns: open reasoning and acting seconds, phase start, reasoning (1/0), closed cycles that
# count, then (reasoning, acting) seconds of each of those cycles, newest first.
_OPEN_REASON, _OPEN_ACT, _SINCE, _REASONING, _COUNT, _CYCLES = range(6)


@dataclass(frozen=True, slots=True)
class IdlenessInputs:
    """The table as of one snapshot: ``slots`` gives each program's row."""

    slots: Mapping[str, int]
    rows: np.ndarray
    cycles: int

    def at(self, now: float) -> list[float]:
        """``signals.idleness`` of every row at ``now``, in row order."""
        rows = self.rows
        open_for = now - rows[:, _SINCE]
        open_for = np.where(open_for < 0.0, 0.0, open_for)  # max(open_for, 0.0)
        reasoning = rows[:, _REASONING] != 0.0
        reason = np.where(reasoning, rows[:, _OPEN_REASON] + open_for, rows[:, _OPEN_REASON])
        act = np.where(reasoning, rows[:, _OPEN_ACT], rows[:, _OPEN_ACT] + open_for)
        for i in range(self.cycles - 1):
            counted = rows[:, _COUNT] > i
            reason = np.where(counted, reason + rows[:, _CYCLES + 2 * i], reason)
            act = np.where(counted, act + rows[:, _CYCLES + 2 * i + 1], act)
        total = reason + act
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total > 0, act / total, 0.0).tolist()


class IdlenessTable:
    """The rows of the programs a state has copied, kept as they change (``put``, ``drop``)."""

    def __init__(self, cycles: int) -> None:
        self.cycles = cycles
        self._slots: dict[str, int] = {}
        self._free: list[int] = []
        self._end = 0  # rows in use or freed; the table beyond is spare
        self._rows = np.zeros((64, _CYCLES + 2 * max(cycles - 1, 0)))

    def put(self, p: ProgramState) -> None:
        """Write ``p``'s row (``p`` is a copy nothing changes later)."""
        slot = self._slots.get(p.program_id)
        if slot is None:
            slot = self._slots[p.program_id] = self._free.pop() if self._free else self._take()
        closed = [x for cycle in islice(reversed(p.cycles), self.cycles - 1) for x in cycle]
        row = self._rows[slot]
        row[:_CYCLES] = (p.open_reason_s, p.open_act_s, p.phase_since, p.phase is Phase.REASONING, len(closed) // 2)
        row[_CYCLES : _CYCLES + len(closed)] = closed

    def drop(self, program_id: str) -> None:
        slot = self._slots.pop(program_id, None)
        if slot is not None:
            self._free.append(slot)

    def inputs(self) -> IdlenessInputs:
        """A copy for a step in another thread (later ``put``\\ s do not reach it)."""
        return IdlenessInputs(dict(self._slots), self._rows[: self._end].copy(), self.cycles)

    def _take(self) -> int:
        if self._end == len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
        self._end += 1
        return self._end - 1
