"""History queries: tool-duration statistics, program lists and per-program timelines.

Results are plain frozen dataclasses, never ORM rows, so they can cross into the policy core
(which seeds its duration history from ``tool_stats_all``) and out to JSON unchanged.
"""

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from maitred.storage.models import EventRow, HandoffRow, LLMCallRow, ProgramRow, ToolCallRow

Since = float | int | datetime | timedelta | str | None
ALL_TOOLS = "*"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, *, now: float | None = None) -> float:
    """``'90s'``, ``'15m'``, ``'1h'``, ``'2d'``, ``'1w'`` ago; an ISO date/time; or unix seconds."""
    now = time.time() if now is None else now
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"since: {text!r} is not a duration like 1h/30m/2d, an ISO date, or unix seconds") from None


def to_epoch(since: Since, *, now: float | None = None) -> float | None:
    if since is None:
        return None
    if isinstance(since, str):
        return parse_since(since, now=now)
    if isinstance(since, timedelta):
        return (time.time() if now is None else now) - since.total_seconds()
    if isinstance(since, datetime):
        return since.timestamp()
    return float(since)


@dataclass(frozen=True, slots=True)
class ToolStats:
    """Durations of completed calls, in seconds. ``std_s`` is the sample standard deviation
    (ddof=1; 0 for a single call) because readiness uses it for a confidence bound on the mean.
    Percentiles use numpy's default (linear) interpolation."""

    tool: str
    n: int
    mean_s: float
    std_s: float
    min_s: float
    max_s: float
    p50_s: float
    p90_s: float
    p99_s: float

    @classmethod
    def of(cls, tool: str, durations: Any) -> "ToolStats":
        d = np.asarray(durations, dtype=float)
        p50, p90, p99 = np.percentile(d, [50, 90, 99])
        return cls(
            tool=tool,
            n=int(d.size),
            mean_s=float(d.mean()),
            std_s=float(d.std(ddof=1)) if d.size > 1 else 0.0,
            min_s=float(d.min()),
            max_s=float(d.max()),
            p50_s=float(p50),
            p90_s=float(p90),
            p99_s=float(p99),
        )


def _durations_query(since: float | None, agent: str | None):
    duration = ToolCallRow.elapsed_s
    query = select(ToolCallRow.tool, ToolCallRow.signature, duration).where(
        ToolCallRow.ended_at.is_not(None),
        duration.is_not(None),
        ToolCallRow.tool.is_not(None),
    )
    if since is not None:
        query = query.where(ToolCallRow.ended_at >= since)
    if agent is not None:
        query = query.where(ToolCallRow.agent == agent)
    return query


def tool_stats_one(
    session: Session, *, tool: str | None, signature: str | None, since: float | None, agent: str | None
) -> ToolStats | None:
    query = _durations_query(since, agent)
    if tool is not None:
        query = query.where(ToolCallRow.tool == tool)
    if signature is not None:
        query = query.where(ToolCallRow.signature == signature)
    durations = [row[2] for row in session.execute(query)]
    if not durations:
        return None
    return ToolStats.of(signature or tool or ALL_TOOLS, durations)


def tool_stats_all(session: Session, *, since: float | None, agent: str | None, by_signature: bool) -> list[ToolStats]:
    groups: dict[str, list[float]] = defaultdict(list)
    everything: list[float] = []
    for tool, signature, duration in session.execute(_durations_query(since, agent)):
        groups[(signature or tool) if by_signature else tool].append(duration)
        everything.append(duration)
    rows = [ToolStats.of(name, groups[name]) for name in sorted(groups)]
    if everything:
        rows.append(ToolStats.of(ALL_TOOLS, everything))
    return rows


@dataclass(frozen=True, slots=True)
class ProgramSummary:
    program_id: str
    parent_program_id: str | None
    agent: str | None
    framework: str | None
    started_at: float | None
    ended_at: float | None
    status: str | None
    tool_calls: int
    llm_calls: int


def _seen_agent_and_start() -> tuple[Any, Any]:
    """A program's agent and start time, from its ``program.start``, else from what else was
    recorded of it: a program seen only through the gateway (its model calls) has no
    ``program.start``, and would otherwise list without either. The agent is that of its first
    model call (else first tool call), the start its first event."""

    def first_agent(row: Any) -> Any:
        return (
            select(row.agent)
            .where(row.program_id == ProgramRow.program_id, row.agent.is_not(None))
            .order_by(row.started_at)
            .limit(1)
            .scalar_subquery()
        )

    agent = func.coalesce(ProgramRow.agent, first_agent(LLMCallRow), first_agent(ToolCallRow))
    started = func.coalesce(
        ProgramRow.started_at, select(func.min(EventRow.ts)).where(EventRow.program_id == ProgramRow.program_id).scalar_subquery()
    )
    return agent, started


def program_summaries(session: Session, *, since: float | None, limit: int) -> list[ProgramSummary]:
    tools = select(ToolCallRow.program_id, func.count().label("n")).group_by(ToolCallRow.program_id).subquery()
    llms = select(LLMCallRow.program_id, func.count().label("n")).group_by(LLMCallRow.program_id).subquery()
    agent, started = _seen_agent_and_start()
    query = (
        select(ProgramRow, agent, started, func.coalesce(tools.c.n, 0), func.coalesce(llms.c.n, 0))
        .outerjoin(tools, tools.c.program_id == ProgramRow.program_id)
        .outerjoin(llms, llms.c.program_id == ProgramRow.program_id)
        .order_by(started.desc().nulls_last(), ProgramRow.program_id)
        .limit(limit)
    )
    if since is not None:
        query = query.where(started >= since)
    return [
        ProgramSummary(
            p.program_id, p.parent_program_id, seen_agent, p.framework, seen_start, p.ended_at, p.status, n_tools, n_llm
        )
        for p, seen_agent, seen_start, n_tools, n_llm in session.execute(query)
    ]


@dataclass(frozen=True, slots=True)
class Span:
    """One interval of a timeline: a model step (``llm``), a tool call (``tool``) or a wait on a
    human (``wait``). ``end`` is None while it is still open."""

    kind: str
    name: str
    start: float
    end: float | None
    status: str | None = None
    agent: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_s(self) -> float | None:
        return None if self.end is None else self.end - self.start


@dataclass(frozen=True, slots=True)
class ProgramTimeline:
    program: ProgramSummary
    spans: list[Span]
    handoffs: list[dict[str, Any]]

    def busy_idle(self) -> dict[str, float]:
        """Seconds spent reasoning (model steps), acting (tools) and waiting on a human."""
        totals: dict[str, float] = defaultdict(float)
        for span in self.spans:
            if span.end is not None:
                totals[span.kind] += span.end - span.start
        return {"reasoning_s": totals["llm"], "acting_s": totals["tool"], "waiting_s": totals["wait"]}


def program_timeline(session: Session, program_id: str) -> ProgramTimeline | None:
    summary = _summary(session, program_id)
    if summary is None:
        return None
    spans: list[Span] = []
    for t in session.scalars(select(ToolCallRow).where(ToolCallRow.program_id == program_id)):
        start = t.started_at if t.started_at is not None else (t.ended_at or 0) - (t.duration_s or 0)
        spans.append(
            Span(
                "tool",
                t.signature or t.tool or "?",
                start,
                t.ended_at,
                t.status,
                t.agent,
                {
                    "call_id": t.call_id,
                    "deadline_s": t.deadline_s,
                    "background": t.background,
                },
            )
        )
    for c in session.scalars(select(LLMCallRow).where(LLMCallRow.program_id == program_id)):
        start = c.started_at if c.started_at is not None else c.ended_at or 0
        spans.append(
            Span(
                "llm",
                c.model or "model",
                start,
                c.ended_at,
                c.status,
                c.agent,
                {
                    "request_id": c.request_id,
                    "prompt_tokens": c.prompt_tokens,
                    "cached_tokens": c.cached_tokens,
                    "completion_tokens": c.completion_tokens,
                    "worker": c.worker,
                    "ttft_s": c.ttft_s,
                },
            )
        )
    spans.extend(wait_spans(session, program_id))
    spans.sort(key=lambda s: (s.start, s.kind))
    handoffs = [
        {
            "ts": h.ts,
            "from_agent": h.from_agent,
            "to_agent": h.to_agent,
            "child_program_id": h.child_program_id,
            "context_tokens": h.context_tokens,
            "context_hash": h.context_hash,
            "n_messages": h.n_messages,
        }
        for h in session.scalars(select(HandoffRow).where(HandoffRow.program_id == program_id).order_by(HandoffRow.ts))
    ]
    return ProgramTimeline(summary, spans, handoffs)


def program_family(session: Session, program_id: str, *, limit: int) -> list[ProgramTimeline]:
    """A program's timeline, then its descendants' (children by ``parent_program_id`` or by a
    handoff's ``child_program_id``), breadth first, each child right after its siblings, at most
    ``limit`` programs; empty for an unknown id. A cycle in the recorded links visits each once."""
    root = program_timeline(session, program_id)
    if root is None:
        return []
    family, seen, level = [root], {program_id}, [program_id]
    while level and len(family) < limit:
        by_parent = select(ProgramRow.program_id).where(ProgramRow.parent_program_id.in_(level))
        by_handoff = select(HandoffRow.child_program_id).where(
            HandoffRow.program_id.in_(level), HandoffRow.child_program_id.is_not(None)
        )
        children = sorted({*session.scalars(by_parent), *session.scalars(by_handoff)} - seen)
        level = []
        for child in children[: limit - len(family)]:
            seen.add(child)
            timeline = program_timeline(session, child)
            if timeline is not None:
                family.append(timeline)
                level.append(child)
    return family


def _summary(session: Session, program_id: str) -> ProgramSummary | None:
    agent, started = _seen_agent_and_start()
    found = session.execute(select(ProgramRow, agent, started).where(ProgramRow.program_id == program_id)).first()
    if found is None:
        return None
    row, seen_agent, seen_start = found
    n_tools = session.scalar(select(func.count()).where(ToolCallRow.program_id == program_id)) or 0
    n_llm = session.scalar(select(func.count()).where(LLMCallRow.program_id == program_id)) or 0
    return ProgramSummary(
        row.program_id, row.parent_program_id, seen_agent, row.framework, seen_start, row.ended_at, row.status, n_tools, n_llm
    )


def wait_spans(session: Session, program_id: str) -> list[Span]:
    """Pair ``program.wait`` with the next ``program.resume`` (an unmatched wait stays open)."""
    query = (
        select(EventRow.type, EventRow.ts)
        .where(EventRow.program_id == program_id, EventRow.type.in_(("program.wait", "program.resume")))
        .order_by(EventRow.ts, EventRow.id)
    )
    spans, opened = [], None
    for kind, ts in session.execute(query):
        if kind == "program.wait" and opened is None:
            opened = ts
        elif kind == "program.resume" and opened is not None:
            spans.append(Span("wait", "human", opened, ts))
            opened = None
    if opened is not None:
        spans.append(Span("wait", "human", opened, None))
    return spans
