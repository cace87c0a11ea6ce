"""Chrome/Perfetto trace-event JSON from plain records, so a program's run opens in the Perfetto UI
(ui.perfetto.dev) or ``chrome://tracing``.

Both ``maitred timeline ID --perfetto`` (a stored program and its children) and
``maitred bench replay --perfetto DIR`` (every simulated program of a run) describe what they
have as the records below: ``Track`` (one per program, grouped under a named process),
``Slice`` (a model call, a tool call, a wait), ``Instant`` (an admission, a tier move) and
``Flow`` (a handoff, drawn as an arrow between two tracks). ``write_trace`` turns them into the
Trace Event Format: ``M`` metadata naming every process and thread, ``X`` complete events, ``i``
instants and ``s``/``f`` flow pairs, timestamps in microseconds from the earliest record. It
writes one event per line as it goes, so a program with tens of thousands of events never sits
in memory twice. Standard library only: the storage side and the simulator both use it.
"""

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["MARK_S", "Flow", "Instant", "Slice", "Track", "write_trace"]

#: How long the marker slices at a flow's two ends last: a flow event binds to the slice that
#: encloses it on its thread, and a handoff happens between model calls, where there is none.
MARK_S = 1e-6


@dataclass(frozen=True, slots=True)
class Track:
    """One timeline row: a thread named ``name`` in the process named ``process``. Tracks are
    laid out in the order given, so a program's children follow it."""

    key: str
    name: str
    process: str


@dataclass(frozen=True, slots=True)
class Slice:
    """An interval on a track, in seconds (any clock, all records the same one). ``end`` None:
    still open when the record was taken, drawn to the end of the trace with ``open: true``."""

    track: str
    name: str
    start: float
    end: float | None
    category: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Instant:
    track: str
    name: str
    ts: float
    category: str
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Flow:
    """An arrow from ``src`` at ``src_ts`` to ``dst`` at ``dst_ts`` (moved to ``src_ts`` when earlier),
    with a marker slice named ``name`` at each end for it to bind to."""

    name: str
    src: str
    src_ts: float
    dst: str
    dst_ts: float
    args: Mapping[str, Any] = field(default_factory=dict)


Record = Slice | Instant | Flow


def _start(record: Record) -> float:
    if isinstance(record, Slice):
        return record.start
    return record.ts if isinstance(record, Instant) else min(record.src_ts, record.dst_ts)


def _end(record: Record) -> float:
    if isinstance(record, Slice):
        return record.start if record.end is None else max(record.end, record.start)
    return record.ts if isinstance(record, Instant) else max(record.src_ts, record.dst_ts) + MARK_S


def _clean(args: Mapping[str, Any]) -> dict[str, Any]:
    """Args without the unset ones, and without NaN or infinity (strict JSON refuses them)."""
    return {k: v for k, v in args.items() if v is not None and not (isinstance(v, float) and not math.isfinite(v))}


def _lanes(spans: list[tuple[float, float]]) -> list[int]:
    """The lane of each (start, end) of one track: slices on one thread must nest, so one that
    overlaps another without nesting (two tools run at once) goes on the next lane that takes it."""
    stacks: list[list[float]] = []
    lane = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: (spans[i][0], -spans[i][1])):
        start, end = spans[i]
        lane[i] = next((n for n, stack in enumerate(stacks) if _fits(stack, start, end)), len(stacks))
        if lane[i] == len(stacks):
            stacks.append([])
        stacks[lane[i]].append(end)
    return lane


def _fits(stack: list[float], start: float, end: float) -> bool:
    """Whether [start, end] nests in a lane whose open slices end at ``stack`` (closing those that ended)."""
    while stack and stack[-1] <= start:
        stack.pop()
    return not stack or stack[-1] >= end


def _marks(flows: list[Flow]) -> list[Slice]:
    """Each flow's two marker slices, source then destination, in order."""
    out = []
    for f in flows:
        dst_ts = max(f.dst_ts, f.src_ts)
        out += [Slice(f.src, f.name, f.src_ts, f.src_ts + MARK_S, "handoff", f.args)]
        out += [Slice(f.dst, f.name, dst_ts, dst_ts + MARK_S, "handoff", f.args)]
    return out


def _lane_of(slices: list[Slice], end: float) -> list[int]:
    """Each slice's lane on its track (an open slice is drawn to ``end``)."""
    by_track: dict[str, list[int]] = {}
    for i, sl in enumerate(slices):
        by_track.setdefault(sl.track, []).append(i)
    lane = [0] * len(slices)
    for indices in by_track.values():
        drawn = [(slices[i].start, end if slices[i].end is None else _end(slices[i])) for i in indices]
        for i, n in zip(indices, _lanes(drawn)):
            lane[i] = n
    return lane


def _threads(
    tracks: list[Track], lanes: Mapping[str, int]
) -> tuple[list[dict[str, Any]], dict[tuple[str, int], tuple[int, int]]]:
    """The ``M`` events naming every process and thread (one per lane of a track, in track
    order), and the (pid, tid) of each (track, lane)."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, int], tuple[int, int]] = {}
    meta: list[dict[str, Any]] = []
    for track in tracks:
        if track.process not in pids:
            pid = pids[track.process] = len(pids) + 1
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": track.process}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        pid = pids[track.process]
        for n in range(lanes.get(track.key, 1)):
            tid = len(tids) + 1
            tids[track.key, n] = (pid, tid)
            name = track.name if n == 0 else f"{track.name} ·{n + 1}"
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return meta, tids


def write_trace(out: TextIO, tracks: Iterable[Track], records: Iterable[Record], *, about: Mapping[str, Any]) -> int:
    """Write one trace-event JSON document to ``out``; returns the number of events written.
    Every record's track must be among ``tracks`` (``KeyError`` names it otherwise).
    ``about`` goes into ``otherData`` (what the trace is of; the Perfetto UI shows it)."""
    tracks, records = list(tracks), list(records)
    keys = {t.key for t in tracks}
    for r in records:
        for key in (r.src, r.dst) if isinstance(r, Flow) else (r.track,):
            if key not in keys:
                raise KeyError(f"record {r.name!r} is on track {key!r}, which is not among the tracks")
    flows = [r for r in records if isinstance(r, Flow)]
    plain = [r for r in records if isinstance(r, Slice)]
    slices = plain + _marks(flows)  # each flow's two marker slices last, in flow order
    origin = min((_start(r) for r in records), default=0.0)
    end = max((_end(r) for r in records), default=origin)
    lane = _lane_of(slices, end)
    lanes: dict[str, int] = {}
    for sl, n in zip(slices, lane):
        lanes[sl.track] = max(lanes.get(sl.track, 1), n + 1)
    meta, tids = _threads(tracks, lanes)

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    def events() -> Iterator[dict[str, Any]]:
        yield from meta
        for sl, n in zip(slices, lane):
            pid, tid = tids[sl.track, n]
            args = _clean(sl.args) | ({"open": True} if sl.end is None else {})
            stop = end if sl.end is None else _end(sl)
            yield {"ph": "X", "name": sl.name, "cat": sl.category, "pid": pid, "tid": tid, "ts": us(sl.start)} | {
                "dur": max(round(us(stop) - us(sl.start), 3), 0.0),
                "args": args,
            }
        for r in records:
            if isinstance(r, Instant):
                pid, tid = tids[r.track, 0]
                yield {"ph": "i", "s": "t", "name": r.name, "cat": r.category, "pid": pid, "tid": tid, "ts": us(r.ts)} | {
                    "args": _clean(r.args)
                }
        for n, f in enumerate(flows):
            for ph, i in (("s", len(plain) + 2 * n), ("f", len(plain) + 2 * n + 1)):
                pid, tid = tids[slices[i].track, lane[i]]
                point = {
                    "ph": ph,
                    "id": n + 1,
                    "name": f.name,
                    "cat": "handoff",
                    "pid": pid,
                    "tid": tid,
                    "ts": us(slices[i].start),
                }
                yield point | ({"bp": "e"} if ph == "f" else {})

    written = 0
    out.write('{"displayTimeUnit": "ms", "otherData": ')
    out.write(json.dumps(_clean({**about, "origin_s": origin}), allow_nan=False, default=str))
    out.write(', "traceEvents": [\n')
    for event in events():
        out.write((",\n" if written else "") + json.dumps(event, allow_nan=False, default=str))
        written += 1
    out.write("\n]}\n")
    return written
