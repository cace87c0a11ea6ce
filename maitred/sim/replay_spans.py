"""What one replay run did, as Perfetto records (``maitred bench replay --perfetto DIR``).

``Replay`` keeps a ``ReplaySpans`` when its run keeps the core's journal: each model call (from
its arrival at the gateway to its last token, with tokens, cache hits, worker and time to first
token), each tool call and each handoff, the handoff drawn as a flow from the producer's last
model call to the consumer's first. ``write`` adds the journal (admissions, forced admissions,
placements and tier moves, as instants) and writes one file: one process of programs, one
track per simulated program in the order they started. At most ``SPAN_LIMIT`` records are
kept; what came after is counted in the file's ``otherData``, so a long run makes a large
file, never an unbounded one.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from maitred.perfetto import Flow, Instant, Record, Slice, Track, write_trace
from maitred.runtime.core import JOURNAL_LIMIT, Entry
from maitred.sim.engine_records import Request
from maitred.sim.traces.records import ToolCall

#: Records kept per run (about 200 bytes each in the file), the same bound as the core's journal.
SPAN_LIMIT = JOURNAL_LIMIT
_JOURNAL_NAMES = {"admit": "admitted", "force": "forced in", "assign": "placed", "lazy": "demotion waits"}


class ReplaySpans:
    def __init__(self, limit: int = SPAN_LIMIT) -> None:
        self.limit = limit
        self.records: list[Record] = []
        self.dropped = 0
        self.programs: dict[str, None] = {}  # in the order they first did something
        self._handoffs: dict[str, tuple[float, str, str]] = {}  # program -> producer's end, from, to

    def _keep(self, record: Record) -> None:
        if len(self.records) < self.limit:
            self.records.append(record)
        else:
            self.dropped += 1

    def model_call(self, req: Request, worker: str, request_id: str) -> None:
        assert req.first_token_at is not None and req.done_at is not None, "a finished request"
        self.programs.setdefault(req.program_id)
        args = {
            "request_id": request_id,
            "agent": req.agent,
            "worker": worker,
            "prompt_tokens": req.context,
            "cached_tokens": req.hit_tokens,
            "host_hit_tokens": req.host_hit_tokens,
            "completion_tokens": req.output,
            "ttft_s": req.first_token_at - req.arrival,
            "status": "ok",
        }
        self._keep(Slice(req.program_id, req.agent, req.arrival, req.done_at, "model", args))
        handoff = self._handoffs.pop(req.program_id, None)
        if handoff is not None:
            at, src, dst = handoff
            self._keep(Flow(f"handoff {src} → {dst}", req.program_id, at, req.program_id, req.arrival, {"to_agent": dst}))

    def tool_call(self, program_id: str, start: float, tool: ToolCall, call_id: str) -> None:
        self.programs.setdefault(program_id)
        args: dict[str, Any] = {"call_id": call_id, "deadline_s": tool.deadline_s, "status": "ok"}
        self._keep(Slice(program_id, tool.signature or tool.name, start, start + tool.duration_s, "tool", args))

    def handoff(self, program_id: str, at: float, from_agent: str, to_agent: str) -> None:
        self._handoffs[program_id] = (at, from_agent, to_agent)

    def journal_records(self, journal: Iterable[Entry]) -> list[Record]:
        """The core's decisions as instants on their programs' tracks (only programs already seen)."""
        out: list[Record] = []
        for e in journal:
            if e.program_id in self.programs:
                name = f"→ {e.detail}" if e.kind == "move" else _JOURNAL_NAMES.get(e.kind, e.kind)
                out.append(
                    Instant(
                        e.program_id,
                        name,
                        e.t,
                        "tier" if e.kind in ("move", "lazy") else "admission",
                        {"worker": e.worker, "detail": e.detail or None},
                    )
                )
        return out

    def write(self, path: Path, journal: Iterable[Entry], about: dict[str, Any]) -> int:
        """Write the run's trace-event JSON to ``path``; returns the number of events."""
        tracks = [Track(pid, pid, "programs") for pid in self.programs]
        records = [*self.records, *self.journal_records(journal)]
        with path.open("w", encoding="utf-8") as out:
            return write_trace(out, tracks, records, about={**about, "records_left_out": self.dropped})
