"""A stored program and its descendants as Perfetto records (``maitred timeline ID --perfetto``).

One process for the family, named after the program asked for; one thread per program in it, the
program first and each child after its parent's generation, so the Perfetto UI shows the
children grouped under it. Model calls, tool calls and waits on a human are slices with what
the store knows of them (tokens, status, worker, deadline); a handoff to a child program is a
flow from the parent's track to the child's, and a child recorded only by its
``parent_program_id`` gets one at its start. A handoff within one program (to another agent
of it) is an instant on its track.
"""

from collections.abc import Sequence
from typing import Any

from maitred.perfetto import Flow, Instant, Record, Slice, Track
from maitred.storage.queries import ProgramTimeline

_CATEGORY = {"llm": "model", "tool": "tool", "wait": "wait"}


def _track_name(t: ProgramTimeline, depth: int) -> str:
    agent = f" ({t.program.agent})" if t.program.agent else ""
    return f"{'  ' * depth}{'└ ' if depth else ''}{t.program.program_id}{agent}"


def _first_seen(t: ProgramTimeline) -> float | None:
    starts = [s.start for s in t.spans]
    if t.program.started_at is not None:
        starts.append(t.program.started_at)
    return min(starts, default=None)


def family_records(family: Sequence[ProgramTimeline]) -> tuple[list[Track], list[Record]]:
    """Tracks and records of ``family`` (``SessionStore.program_family``: the program first)."""
    ids = {t.program.program_id for t in family}
    depth: dict[str, int] = {}
    for t in family:
        parent = t.program.parent_program_id
        depth[t.program.program_id] = depth[parent] + 1 if parent in depth else (1 if depth else 0)
    process = f"program {family[0].program.program_id}" if family else "program"
    tracks = [Track(t.program.program_id, _track_name(t, depth[t.program.program_id]), process) for t in family]
    records: list[Record] = []
    linked: set[str] = set()
    for t in family:
        pid = t.program.program_id
        for s in t.spans:
            args: dict[str, Any] = {"agent": s.agent, "status": s.status or ("open" if s.end is None else None), **s.detail}
            records.append(Slice(pid, s.name, s.start, s.end, _CATEGORY[s.kind], args))
        for h in t.handoffs:
            child = h.get("child_program_id")
            name = f"handoff {h['from_agent']} → {h['to_agent']}"
            args = {k: v for k, v in h.items() if k != "ts"}
            if child in ids and child not in linked:
                linked.add(child)
                child_start = _first_seen(next(c for c in family if c.program.program_id == child))
                records.append(Flow(name, pid, h["ts"], child, max(h["ts"], child_start or h["ts"]), args))
            else:
                records.append(Instant(pid, name, h["ts"], "handoff", args))
    for t in family:
        parent, pid, start = t.program.parent_program_id, t.program.program_id, _first_seen(t)
        if parent in ids and pid not in linked and start is not None:
            records.append(Flow(f"child {pid}", parent, start, pid, start, {"child_program_id": pid}))
    return tracks, records
