"""Turn a batch of events into rows: one log row per event, one derived row per entity.

Events of one entity (a tool call's start, progress and end; a program's start and end) are
merged here, so each table receives a single upsert per key per batch — PostgreSQL refuses an
``INSERT ... ON CONFLICT`` that touches the same row twice — and later fields win. A program's
row describes its latest life: a ``program.start`` after its ``program.end`` (a LangGraph thread
invoked again, a resumed Claude Code session) opens it again (no end, no status), and the agent
of its ``program.end`` (the one that ran last) replaces that of its start.
"""

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import orjson

from maitred.events import (
    INT64_MAX,
    INT64_MIN,
    Event,
    EventError,
    Handoff,
    LLMEnd,
    LLMStart,
    ProgramEnd,
    ProgramStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
    decode_event,
    encode_event,
)
from maitred.storage.errors import first_line

PROGRAM_COLUMNS = ("program_id", "parent_program_id", "agent", "framework", "started_at", "ended_at", "status", "attrs")
TOOL_COLUMNS = (
    "program_id",
    "call_id",
    "agent",
    "tool",
    "signature",
    "started_at",
    "ended_at",
    "deadline_s",
    "background",
    "status",
    "duration_s",
    "progress_fraction",
    "progress_eta_s",
    "progress_at",
)
LLM_COLUMNS = (
    "program_id",
    "request_id",
    "agent",
    "model",
    "started_at",
    "ended_at",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "worker",
    "ttft_s",
    "status",
)


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces; anything JSON cannot hold (a datetime in ``attrs``) becomes its
    ``str`` rather than failing the whole batch."""
    return orjson.dumps(value, default=str, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()


def event_key(ts: float, body: str) -> str:
    """Idempotency key: the time, then a content hash. Leading with the time keeps inserts into
    the unique index nearly sequential (events arrive roughly in time order); a bare random hash
    made every insert land on a random index page and cut SQLite ingest by two thirds."""
    return key_floor(ts) + hashlib.sha1(body.encode()).hexdigest()[:23]


def key_floor(ts: float) -> str:
    """The lowest ``event_key`` of events stamped at or after ``ts``: a range on the keys' unique
    index finds recent events without an index on ``ts``."""
    return f"{ts:017.6f}"


def keyed(event: Event) -> tuple[str, str]:
    """An event's idempotency key and its stored body (canonical JSON): the store keys its log
    by it, and the gateway's ingest by the same key, so both count a re-sent event once.
    Raises what ``canonical_json`` raises for a value JSON cannot hold."""
    body = canonical_json(encode_event(event))
    return event_key(event.ts, body), body


@dataclass
class Folded:
    """Rows for each table, and the events that could not be turned into rows at all
    (``refused``: input position and reason), e.g. ``attrs`` nested deeper than JSON encoding allows."""

    events: list[dict[str, Any]] = field(default_factory=list)
    programs: dict[str, dict[str, Any]] = field(default_factory=dict)
    tool_calls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    llm_calls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    handoffs: list[dict[str, Any]] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)


def _merge(rows: dict[Any, dict[str, Any]], key: Any, columns: tuple[str, ...], values: dict[str, Any]) -> None:
    row = rows.get(key)
    if row is None:
        rows[key] = row = dict.fromkeys(columns)
    for column, value in values.items():  # a plain loop: a generator here cost 10% of ingest
        if value is not None:
            row[column] = value


def fold(events: Iterable[Event]) -> Folded:
    out = Folded()
    seen: set[str] = set()
    for index, event in enumerate(events):
        try:
            key, body = keyed(event)
        except (TypeError, ValueError, RecursionError) as exc:  # orjson.JSONEncodeError is a TypeError
            out.refused.append((index, refusal_reason(event, exc)))
            continue
        if key in seen:
            continue
        seen.add(key)
        out.events.append({"event_key": key, "type": event.TYPE, "ts": event.ts, "program_id": event.program_id, "body": body})
        _fold_one(out, event, key)
    return out


def _fold_one(out: Folded, e: Event, key: str) -> None:
    pid = e.program_id
    match e:
        case ToolStart():
            _merge(
                out.tool_calls,
                (pid, e.call_id),
                TOOL_COLUMNS,
                {
                    "program_id": pid,
                    "call_id": e.call_id,
                    "agent": e.agent,
                    "tool": e.tool,
                    "signature": e.signature,
                    "started_at": e.ts,
                    "deadline_s": e.deadline_s,
                    "background": e.background,
                },
            )
        case ToolProgress():
            _merge(
                out.tool_calls,
                (pid, e.call_id),
                TOOL_COLUMNS,
                {
                    "program_id": pid,
                    "call_id": e.call_id,
                    "progress_fraction": e.fraction,
                    "progress_eta_s": e.eta_s,
                    "progress_at": e.ts,
                },
            )
        case ToolEnd():
            _merge(
                out.tool_calls,
                (pid, e.call_id),
                TOOL_COLUMNS,
                {
                    "program_id": pid,
                    "call_id": e.call_id,
                    "ended_at": e.ts,
                    "status": e.status,
                    "duration_s": e.duration_s,
                },
            )
        case LLMStart():
            _merge(
                out.llm_calls,
                (pid, e.request_id),
                LLM_COLUMNS,
                {
                    "program_id": pid,
                    "request_id": e.request_id,
                    "agent": e.agent,
                    "model": e.model,
                    "started_at": e.ts,
                    "prompt_tokens": e.prompt_tokens,
                },
            )
        case LLMEnd():
            _merge(
                out.llm_calls,
                (pid, e.request_id),
                LLM_COLUMNS,
                {
                    "program_id": pid,
                    "request_id": e.request_id,
                    "agent": e.agent,
                    "ended_at": e.ts,
                    "prompt_tokens": e.prompt_tokens,
                    "cached_tokens": e.cached_tokens,
                    "completion_tokens": e.completion_tokens,
                    "worker": e.worker,
                    "ttft_s": e.ttft_s,
                    "status": e.status,
                },
            )
        case ProgramStart():
            row = out.programs.get(pid)
            if row is not None and row["ended_at"] is not None and row["ended_at"] <= e.ts:
                row["ended_at"] = row["status"] = None  # started again after its end: running again
            _merge(
                out.programs,
                pid,
                PROGRAM_COLUMNS,
                {
                    "program_id": pid,
                    "parent_program_id": e.parent_program_id,
                    "agent": e.agent,
                    "framework": e.framework,
                    "started_at": e.ts,
                    "attrs": canonical_json(e.attrs) if e.attrs else None,
                },
            )
        case ProgramEnd():
            _merge(
                out.programs, pid, PROGRAM_COLUMNS, {"program_id": pid, "agent": e.agent, "ended_at": e.ts, "status": e.status}
            )
        case Handoff():
            out.handoffs.append(
                {
                    "event_key": key,
                    "program_id": pid,
                    "ts": e.ts,
                    "agent": e.agent,
                    "from_agent": e.from_agent,
                    "to_agent": e.to_agent,
                    "child_program_id": e.child_program_id,
                    "context_tokens": e.context_tokens,
                    "context_hash": e.context_hash,
                    "n_messages": len(e.messages) if e.messages is not None else None,
                }
            )
    if pid not in out.programs:
        # Every program seen gets a row, even when its program.start was never sent.
        _merge(out.programs, pid, PROGRAM_COLUMNS, {"program_id": pid})


def column_refusal(event: Event, *, nul_ok: bool) -> str | None:
    """A value no column can hold, named by field: an integer beyond 64 bits, or a NUL byte in
    a text column (PostgreSQL refuses those; SQLite stores them, hence ``nul_ok``). Cheap, so a
    refused batch is screened with it before any splitting."""
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            return f"{f.name}: out of range for the database (64-bit integers)"
        if not nul_ok and isinstance(value, str) and "\x00" in value:
            return f"{f.name}: contains a NUL byte, which the database cannot store"
    return None


def refusal_reason(event: Event, error: BaseException) -> str:
    """Why the database refused ``event`` alone, naming the field where possible: a value no
    column holds, a value JSON cannot encode, then validation (an event built in-process
    skipped it: a list where a name belongs); else the database's own first line."""
    reason = column_refusal(event, nul_ok=False)
    if reason is not None:
        return reason
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, (dict, list, tuple)):
            try:
                canonical_json(value)
            except (TypeError, ValueError, RecursionError) as exc:
                return f"{f.name}: cannot be stored as JSON ({exc})"
    try:
        decode_event(encode_event(event), now=math.inf)  # the clock is not the database's concern
    except EventError as exc:
        return str(exc)
    return first_line(error)
