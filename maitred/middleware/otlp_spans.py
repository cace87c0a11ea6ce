"""maitred's events as OpenTelemetry spans under the GenAI semantic conventions.

One trace per program: its id is a hash of the program id, and so are the span ids (of the
program, of each model request, of each tool call), so events of one program that reach
different processes or sinks (the agent's middleware, the gateway) still land in one trace,
under one ``invoke_agent`` span. ``chat`` spans are model calls and ``execute_tool`` spans tool
calls; handoffs, waits and tool progress are span events, and a subagent's or handoff's
program is a span link (each program keeps its own trace).

A start's span also carries what its recorder noted for it (``SpanNotes``: the gateway's tier,
worker and predicted tool return), under the same key.

A span is made when its end event arrives, from the start event kept since (``SpanPairs``):
OTLP carries finished spans only. A start whose end never comes is ended anyway, marked
``maitred.incomplete=true`` (with ``maitred.missing="end"``): when its program ends, when more
than ``max_open`` spans are open (the oldest first), and at ``close``. An end whose start this
sink never saw makes a span too, marked the same way (``maitred.missing="start"``).

Nothing here does I/O or reads the clock except ``close``'s end time; ``OtlpSink`` exports.
"""

import functools
import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from maitred import __version__
from maitred.events import (
    Event,
    Handoff,
    LLMEnd,
    LLMStart,
    ProgramEnd,
    ProgramStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
    to_otel_attributes,
)
from maitred.middleware.span_notes import SpanKey, SpanNotes, span_key

#: The most spans kept open (a start without its end yet); about 1 KB each.
MAX_OPEN_SPANS = 10_000
_SCOPE = InstrumentationScope("maitred", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: The GenAI operation of each kind of span (``span_key``).
_OPERATIONS = {"program": "invoke_agent", "llm": "chat", "tool": "execute_tool"}


class FixedResource(Resource):
    """A ``Resource`` whose hash is computed once: the exporter groups spans by resource, and
    the SDK's hash serialises every attribute to JSON each time, once per span (a third of
    the cost of encoding a tool call's span)."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._cached_hash = super().__hash__()

    def __hash__(self) -> int:
        return self._cached_hash


def _hash(size: int, *parts: str) -> int:
    digest = hashlib.blake2b("\x1f".join(parts).encode("utf-8", "surrogateescape"), digest_size=size).digest()
    return int.from_bytes(digest) or 1  # an all-zero id is invalid in OTLP


@functools.lru_cache(maxsize=4096)  # every span of a program asks for it (its own, its parent's)
def trace_id(program_id: str) -> int:
    return _hash(16, "trace", program_id)


def span_context(program_id: str, kind: str = "program", key: str = "") -> SpanContext:
    """The span of ``program_id`` itself, or of its model request or tool call ``key``."""
    return SpanContext(trace_id(program_id), _hash(8, kind, program_id, key), is_remote=False, trace_flags=_SAMPLED)


def span_attributes(event: Event) -> dict[str, Any]:
    """``to_otel_attributes`` without the event type, which a span's name and operation say."""
    attrs = to_otel_attributes(event)
    del attrs["maitred.event.type"]
    return attrs


class Finished(NamedTuple):
    """A span ready to export, and how many events it was made of (counted if it is refused)."""

    span: ReadableSpan
    events: int


@dataclass(slots=True)
class _Open:
    name: str
    kind: SpanKind
    context: SpanContext
    parent: SpanContext | None
    program_id: str
    start_ns: int
    attributes: dict[str, Any]
    events: list[SpanEvent] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    count: int = 1

    def annotate(self, event: Event) -> None:
        self.events.append(SpanEvent(event.TYPE, span_attributes(event), _ns(event.ts)))
        self.count += 1


def _ns(ts: float) -> int:
    return int(ts * 1e9)


def _status(status: str) -> Status:
    return Status(StatusCode.UNSET) if status == "ok" else Status(StatusCode.ERROR, status)


class SpanPairs:
    """Pairs start and end events into finished spans; bounded by ``max_open`` open spans."""

    def __init__(self, resource: Resource, *, max_open: int = MAX_OPEN_SPANS, notes: SpanNotes | None = None) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, got {max_open!r}")
        self.resource = FixedResource(resource)
        self.max_open = max_open
        self.notes = notes
        self._open: dict[SpanKey, _Open] = {}

    def __len__(self) -> int:
        return len(self._open)

    def feed(self, events: Iterable[Event]) -> list[Finished]:
        """The spans these events finish, in the order they finished."""
        done: list[Finished] = []
        for event in events:
            if isinstance(event, (ProgramStart, LLMStart, ToolStart)):
                self._start(event, done)
            elif isinstance(event, (ProgramEnd, LLMEnd, ToolEnd)):
                self._end(event, done)
            else:
                self._annotate(event, done)
        return done

    def close(self, now: float | None = None) -> list[Finished]:
        """Every open span, ended now and marked incomplete."""
        end_ns = _ns(time.time() if now is None else now)
        spans = [self._finish(o, end_ns, {}, None, missing="end") for o in self._open.values()]
        self._open.clear()
        return spans

    # -- starts and ends ----------------------------------------------------------------------

    def _start(self, event: ProgramStart | LLMStart | ToolStart, done: list[Finished]) -> None:
        key, opened = span_key(event), self._opened(event)
        if key in self._open:  # a start sent twice (a retried batch): the first one stands
            return
        if len(self._open) >= self.max_open:
            oldest = next(iter(self._open))
            done.append(self._finish(self._open.pop(oldest), _ns(event.ts), {}, None, missing="end"))
        self._open[key] = opened

    def _opened(self, event: ProgramStart | LLMStart | ToolStart) -> _Open:
        key = span_key(event)
        attrs = {"gen_ai.operation.name": _OPERATIONS[key[0]], **span_attributes(event)}
        if self.notes is not None:  # what the recorder knew when the start was recorded
            attrs.update(self.notes.take(key))
        pid, start = event.program_id, _ns(event.ts)
        if isinstance(event, ProgramStart):
            opened = _Open(_named("invoke_agent", event.agent), SpanKind.INTERNAL, span_context(pid), None, pid, start, attrs)
            if event.parent_program_id is not None:
                opened.links.append(Link(span_context(event.parent_program_id), {"maitred.link": "parent_program"}))
            return opened
        if isinstance(event, LLMStart):
            context = span_context(pid, "llm", event.request_id)
            return _Open(_named("chat", event.model), SpanKind.CLIENT, context, span_context(pid), pid, start, attrs)
        context = span_context(pid, "tool", event.call_id)
        return _Open(_named("execute_tool", event.tool), SpanKind.INTERNAL, context, span_context(pid), pid, start, attrs)

    def _end(self, event: ProgramEnd | LLMEnd | ToolEnd, done: list[Finished]) -> None:
        end_ns, attrs = _ns(event.ts), span_attributes(event)
        opened = self._open.pop(span_key(event), None)
        if isinstance(event, ProgramEnd):  # what the program left open ends with it
            for child in [k for k, o in self._open.items() if o.program_id == event.program_id]:
                done.append(self._finish(self._open.pop(child), end_ns, {}, None, missing="end"))
        if opened is not None:
            opened.count += 1
            done.append(self._finish(opened, end_ns, attrs, event.status, missing=None))
            return
        start_ns = end_ns
        if isinstance(event, ToolEnd) and event.duration_s is not None:
            start_ns = _ns(event.ts - event.duration_s)
        kind, pid, key = span_key(event)
        operation = _OPERATIONS[kind]
        orphan = _Open(
            operation,
            SpanKind.CLIENT if kind == "llm" else SpanKind.INTERNAL,
            span_context(pid, kind, key),
            None if kind == "program" else span_context(pid),
            pid,
            start_ns,
            {"gen_ai.operation.name": operation},
        )
        done.append(self._finish(orphan, end_ns, attrs, event.status, missing="start"))

    def _annotate(self, event: Event, done: list[Finished]) -> None:
        """A span event on the tool call's span (progress) or the program's (the rest); on a
        span of its own, zero long, under the program's span when this sink holds neither."""
        key = span_key(event) if isinstance(event, ToolProgress) else ("program", event.program_id, "")
        target = self._open.get(key) or self._open.get(("program", event.program_id, ""))
        link = None
        if isinstance(event, Handoff) and event.child_program_id is not None:
            link = Link(span_context(event.child_program_id), {"maitred.link": "handoff", "maitred.to_agent": event.to_agent})
        if target is not None:
            target.annotate(event)
            if link is not None:
                target.links.append(link)
            return
        point = _Open(
            event.TYPE,
            SpanKind.INTERNAL,
            span_context(event.program_id, event.TYPE, f"{event.ts!r}"),
            span_context(event.program_id),
            event.program_id,
            _ns(event.ts),
            span_attributes(event),
            links=[link] if link is not None else [],
        )
        done.append(self._finish(point, point.start_ns, {}, None, missing=None))

    def _finish(
        self, opened: _Open, end_ns: int, attrs: Mapping[str, Any], status: str | None, *, missing: str | None
    ) -> Finished:
        attributes = {**opened.attributes, **attrs}
        if missing is not None:
            attributes["maitred.incomplete"] = True
            attributes["maitred.missing"] = missing
        span = ReadableSpan(
            opened.name,
            context=opened.context,
            parent=opened.parent,
            resource=self.resource,
            attributes=attributes,
            events=tuple(opened.events),
            links=tuple(opened.links),
            kind=opened.kind,
            instrumentation_scope=_SCOPE,
            status=_status(status) if status is not None else Status(StatusCode.UNSET),
            start_time=opened.start_ns,
            end_time=max(end_ns, opened.start_ns),
        )
        return Finished(span, opened.count)


def _named(operation: str, what: str | None) -> str:
    """GenAI span names: the operation, then the agent, model or tool where known."""
    return f"{operation} {what}" if what else operation
