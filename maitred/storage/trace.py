"""``export_trace``: the session history as a replayable JSONL trace (docs/trace-format.md).

The first line is a header; then one line per program with its steps (model calls with token
counts), tool calls (durations and deadlines), handoffs and human waits, all times in unix
seconds. The simulator's reader for this format lives in ``maitred.sim``.
"""

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from maitred.events import TRACE_FORMAT, TRACE_VERSION
from maitred.storage.models import HandoffRow, LLMCallRow, ProgramRow, ToolCallRow
from maitred.storage.queries import wait_spans


def _by_program(session: Session, model: Any, ids: list[str], order: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = defaultdict(list)
    for chunk_start in range(0, len(ids), 500):
        chunk = ids[chunk_start : chunk_start + 500]
        for row in session.scalars(select(model).where(model.program_id.in_(chunk)).order_by(order)):
            out[row.program_id].append(row)
    return out


def write_trace(session: Session, path: Path, *, since: float | None) -> int:
    query = select(ProgramRow).order_by(ProgramRow.started_at.nulls_last(), ProgramRow.program_id)
    if since is not None:
        query = query.where(ProgramRow.started_at >= since)
    programs = list(session.scalars(query))
    ids = [p.program_id for p in programs]
    tools = _by_program(session, ToolCallRow, ids, ToolCallRow.started_at)
    steps = _by_program(session, LLMCallRow, ids, LLMCallRow.started_at)
    handoffs = _by_program(session, HandoffRow, ids, HandoffRow.ts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        out.write(
            json.dumps({"format": TRACE_FORMAT, "version": TRACE_VERSION, "exported_at": time.time(), "programs": len(programs)})
            + "\n"
        )
        for p in programs:
            record = {
                "program_id": p.program_id,
                "parent_program_id": p.parent_program_id,
                "agent": p.agent,
                "framework": p.framework,
                "start": p.started_at,
                "end": p.ended_at,
                "status": p.status,
                "steps": [
                    {
                        "request_id": s.request_id,
                        "agent": s.agent,
                        "model": s.model,
                        "start": s.started_at,
                        "end": s.ended_at,
                        "prompt_tokens": s.prompt_tokens,
                        "cached_tokens": s.cached_tokens,
                        "completion_tokens": s.completion_tokens,
                        "ttft_s": s.ttft_s,
                        "status": s.status,
                    }
                    for s in steps[p.program_id]
                ],
                "tool_calls": [
                    {
                        "call_id": t.call_id,
                        "agent": t.agent,
                        "tool": t.tool,
                        "signature": t.signature,
                        "start": t.started_at,
                        "end": t.ended_at,
                        "duration_s": t.elapsed_s,
                        "deadline_s": t.deadline_s,
                        "background": bool(t.background),
                        "status": t.status,
                    }
                    for t in tools[p.program_id]
                ],
                "handoffs": [
                    {
                        "ts": h.ts,
                        "from_agent": h.from_agent,
                        "to_agent": h.to_agent,
                        "child_program_id": h.child_program_id,
                        "context_tokens": h.context_tokens,
                        "context_hash": h.context_hash,
                        "n_messages": h.n_messages,
                    }
                    for h in handoffs[p.program_id]
                ],
                "waits": [{"start": w.start, "end": w.end} for w in wait_spans(session, p.program_id)],
            }
            out.write(json.dumps(record) + "\n")
    return len(programs)
