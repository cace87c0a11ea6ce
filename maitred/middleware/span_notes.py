"""Attributes a recorder adds to a span beside what its events carry (``OtlpSink.note``).

The gateway knows things no event says — a program's tier and worker when its model call
arrives, the return it predicts for a tool call — and they are true only at the moment the
event is recorded, on the gateway's loop. They are computed there and kept here under the
span's key (what ``SpanPairs`` pairs a start and its end by) until the span's start event is
turned into a span on the sink's thread, which takes them. Keyed by span rather than carried
in the event, so the event vocabulary, the emitter's queue and the store stay as they are.

A note whose start event never reaches the sink (dropped by a full queue) is forgotten, the
oldest first, past ``max_notes``; the lock is held for a dict operation only, never for I/O.
"""

import threading
from collections.abc import Mapping
from typing import Any

from maitred.events import Event, LLMEnd, LLMStart, ToolEnd, ToolProgress, ToolStart

SpanKey = tuple[str, str, str]
#: Notes kept at most (a few hundred bytes each): as many as spans kept open.
MAX_NOTES = 10_000


def span_key(event: Event) -> SpanKey:
    """The span an event belongs to: a model request, a tool call, or its program."""
    if isinstance(event, (LLMStart, LLMEnd)):
        return ("llm", event.program_id, event.request_id)
    if isinstance(event, (ToolStart, ToolEnd, ToolProgress)):
        return ("tool", event.program_id, event.call_id)
    return ("program", event.program_id, "")


class SpanNotes:
    """Attributes by span key, written on one thread and taken on another; bounded."""

    def __init__(self, max_notes: int = MAX_NOTES) -> None:
        if max_notes < 1:
            raise ValueError(f"max_notes must be at least 1, got {max_notes!r}")
        self.max_notes = max_notes
        self._notes: dict[SpanKey, Mapping[str, Any]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._notes)

    def put(self, key: SpanKey, attributes: Mapping[str, Any]) -> None:
        notes = self._notes
        with self._lock:
            if len(notes) >= self.max_notes and key not in notes:
                del notes[next(iter(notes))]
            notes[key] = attributes

    def take(self, key: SpanKey) -> Mapping[str, Any]:
        """The span's note, removed; empty when there is none."""
        with self._lock:
            return self._notes.pop(key, {})
