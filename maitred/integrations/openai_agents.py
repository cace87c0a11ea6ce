"""OpenAI Agents SDK (openai-agents 0.24): tracing spans as maitred events (SPEC section 8).

``MaitredTracingProcessor`` is a ``TracingProcessor``: function spans become tool calls, handoff
spans handoffs, and generation spans (the Chat Completions model) or response spans (the
default Responses model) model calls. The program is the trace's ``group_id`` (the SDK's
conversation id; ``RunConfig(group_id=...)``), which only the trace carries, so the processor
maps ``trace_id -> group_id`` in ``on_trace_start``; a trace without a group is its own program.
The agent is the name of the agent span a span sits under. A trace is one run of the program:
``on_trace_start`` records ``program.start`` (framework ``openai-agents``, the workflow name in
``attrs``), ``on_trace_end`` ``program.end`` naming the agent that ran last, status error when an
agent span failed; a group run again starts its program again.

Function spans carry no tool call id. ``MaitredRunHooks`` supplies it: passed to
``Runner.run(..., hooks=MaitredRunHooks(processor))``, its ``on_tool_start`` runs inside the
function span and binds that span to ``context.tool_call_id``; the processor then records the
call under the model's id. While hooks are attached, a function span that was never bound (a run
without them) is recorded at its end under its span id, so no call is lost::

    processor = MaitredTracingProcessor()
    agents.add_trace_processor(processor)   # or set_trace_processors([processor]) to drop the vendor exporter
    await Runner.run(agent, "hi", hooks=MaitredRunHooks(processor), run_config=RunConfig(group_id="p-42"))
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from agents import RunHooks
from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    HandoffSpanData,
    ResponseSpanData,
    Span,
    Trace,
    TracingProcessor,
    get_current_span,
)

from maitred.events import Handoff, LLMEnd, LLMStart, ProgramEnd, ProgramStart, ToolEnd, ToolStart
from maitred.middleware.config import emit, flush

__all__ = ["FRAMEWORK", "MaitredRunHooks", "MaitredTracingProcessor"]

log = logging.getLogger("maitred")


@dataclass(slots=True)
class _OpenTool:
    program_id: str
    agent: str | None
    tool: str
    started: float
    call_id: str | None = None


#: ``program.start``'s ``framework`` for programs this processor opens.
FRAMEWORK = "openai-agents"


@dataclass(slots=True)
class _Run:
    """What a trace's ``program.end`` reports: the agent whose span ended last, and whether any
    agent span ended with an error (the SDK puts a run's failure on the agent span it hit)."""

    agent: str | None = None
    failed: bool = False


def _workflow(trace: Trace) -> dict[str, Any] | None:
    name = getattr(trace, "name", None)
    return {"workflow": name} if isinstance(name, str) and name else None


def _guarded(what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # telemetry never reaches the agent
        log.debug("maitred: %s not recorded", what, exc_info=True)


def _tokens(usage: Any, *names: str) -> int:
    """The first count present under any of ``names`` (dicts and objects alike)."""
    for name in names:
        value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
        if isinstance(value, int):
            return value
    return 0


def _cached(usage: Any) -> int | None:
    details = (
        (usage.get("input_tokens_details") or usage.get("prompt_tokens_details"))
        if isinstance(usage, dict)
        else (getattr(usage, "input_tokens_details", None) or getattr(usage, "prompt_tokens_details", None))
    )
    if details is None:
        return None
    value = details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    return value if isinstance(value, int) else None


class MaitredTracingProcessor(TracingProcessor):
    """Agents SDK spans to maitred events; ``program_id`` names the program of ungrouped traces.
    ``record_model_calls=False`` leaves the model calls to the maitred gateway when the model is
    served through it (it records them itself)."""

    def __init__(self, *, program_id: str | None = None, record_model_calls: bool = True) -> None:
        self.program_id = program_id
        self.record_model_calls = record_model_calls
        self.hooks_attached = False
        self._lock = threading.Lock()
        self._programs: dict[str, str] = {}
        self._agents: dict[str, str] = {}
        self._tools: dict[str, _OpenTool] = {}
        self._models: dict[str, float] = {}
        self._runs: dict[str, _Run] = {}

    # traces: one trace is one run of the program (``Runner.run``, or a ``trace()`` block around several)

    def on_trace_start(self, trace: Trace) -> None:
        group = getattr(trace, "group_id", None)
        program = group or self.program_id or trace.trace_id
        with self._lock:
            self._programs[trace.trace_id] = program
            self._runs[trace.trace_id] = _Run()
        _guarded(
            "program.start",
            lambda: emit(ProgramStart(ts=time.time(), program_id=program, framework=FRAMEWORK, attrs=_workflow(trace))),
        )

    def on_trace_end(self, trace: Trace) -> None:
        with self._lock:
            program = self._programs.pop(trace.trace_id, None)
            run = self._runs.pop(trace.trace_id, None) or _Run()
        if program is None:
            return
        status: Literal["ok", "error"] = "error" if run.failed else "ok"
        _guarded(
            "program.end",
            lambda: emit(ProgramEnd(ts=time.time(), program_id=program, agent=run.agent, status=status)),
        )

    def _program(self, span: Span[Any]) -> str:
        return self._programs.get(span.trace_id) or self.program_id or span.trace_id

    # spans

    def on_span_start(self, span: Span[Any]) -> None:
        _guarded("span start", lambda: self._started(span))

    def _started(self, span: Span[Any]) -> None:
        data = span.span_data
        agent = data.name if isinstance(data, AgentSpanData) else self._agents.get(span.parent_id or "")
        if agent is not None:  # spans inherit the agent of the agent span above them, at any depth
            self._agents[span.span_id] = agent
        if isinstance(data, FunctionSpanData):
            tool = _OpenTool(self._program(span), agent, data.name, time.time())
            self._tools[span.span_id] = tool
            if not self.hooks_attached:
                self._tool_started(tool, span.span_id)
        elif isinstance(data, (GenerationSpanData, ResponseSpanData)) and self.record_model_calls:
            now = time.time()
            self._models[span.span_id] = now
            model = data.model if isinstance(data, GenerationSpanData) else None
            emit(LLMStart(ts=now, program_id=self._program(span), agent=agent, request_id=span.span_id, model=model))

    def _tool_started(self, tool: _OpenTool, call_id: str, ts: float | None = None) -> None:
        tool.call_id = call_id
        emit(ToolStart(ts=ts or tool.started, program_id=tool.program_id, agent=tool.agent, call_id=call_id, tool=tool.tool))

    def bind(self, span_id: str, call_id: str) -> None:
        """The function span ``span_id`` runs tool call ``call_id`` (called by ``MaitredRunHooks``)."""
        tool = self._tools.get(span_id)
        if tool is not None and tool.call_id is None:
            self._tool_started(tool, call_id, time.time())

    def on_span_end(self, span: Span[Any]) -> None:
        _guarded("span end", lambda: self._ended(span))

    def _ended(self, span: Span[Any]) -> None:
        data = span.span_data
        now = time.time()
        agent = self._agents.pop(span.span_id, None)
        if isinstance(data, AgentSpanData):
            run = self._runs.get(span.trace_id)
            if run is not None:
                run.agent = data.name
                run.failed = run.failed or span.error is not None
        if isinstance(data, FunctionSpanData):
            tool = self._tools.pop(span.span_id, None)
            if tool is None:
                return
            if tool.call_id is None:  # hooks attached but not on this run: keep the call anyway
                self._tool_started(tool, span.span_id)
            emit(
                ToolEnd(
                    ts=now,
                    program_id=tool.program_id,
                    agent=tool.agent,
                    call_id=tool.call_id or span.span_id,
                    status="error" if span.error else "ok",
                    duration_s=now - tool.started,
                )
            )
        elif isinstance(data, HandoffSpanData):
            program = self._program(span)
            if data.to_agent:
                emit(
                    Handoff(
                        ts=now,
                        program_id=program,
                        agent=data.from_agent or agent,
                        from_agent=data.from_agent or agent or "agent",
                        to_agent=data.to_agent,
                    )
                )
        elif isinstance(data, (GenerationSpanData, ResponseSpanData)):
            self._model_ended(span, data, now, agent)

    def _model_ended(self, span: Span[Any], data: GenerationSpanData | ResponseSpanData, now: float, agent: str | None) -> None:
        if self._models.pop(span.span_id, None) is None:
            return
        program = self._program(span)
        if isinstance(data, GenerationSpanData):
            usage: Any = data.usage or {}
        else:
            usage = getattr(data.response, "usage", None) or data.usage or {}
        emit(
            LLMEnd(
                ts=now,
                program_id=program,
                agent=agent,
                request_id=span.span_id,
                prompt_tokens=_tokens(usage, "input_tokens", "prompt_tokens"),
                completion_tokens=_tokens(usage, "output_tokens", "completion_tokens"),
                cached_tokens=_cached(usage),
                status="error" if span.error else "ok",
            )
        )

    # lifecycle

    def shutdown(self) -> None:
        flush(timeout=5.0)

    def force_flush(self) -> None:
        flush(timeout=5.0)


class MaitredRunHooks(RunHooks):
    """Gives the processor each function tool's real ``tool_call_id`` (``Runner.run(hooks=...)``)."""

    def __init__(self, processor: MaitredTracingProcessor) -> None:
        super().__init__()
        self.processor = processor
        processor.hooks_attached = True

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        def bind() -> None:
            call_id = getattr(context, "tool_call_id", None)
            span = get_current_span()
            if isinstance(call_id, str) and call_id and span is not None:
                self.processor.bind(span.span_id, call_id)

        _guarded("tool call id", bind)
