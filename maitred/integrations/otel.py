"""OpenTelemetry in: ``MaitredSpanProcessor`` turns the tool and model spans an instrumented agent
already emits into maitred events, so an agent traced by OpenInference or OpenLLMetry needs one
line, not a second set of hooks (``pip install 'maitred[otel]'``)::

    from maitred.integrations.otel import MaitredSpanProcessor

    provider.add_span_processor(MaitredSpanProcessor())

Which spans count, and how the program id is chosen, is ``maitred.integrations.otel_spans``
(shared with the gateway's ``POST /v1/traces``). Events go through the middleware's emitter
(``maitred.configure``), live where the span allows it:

- a span whose kind its start names (a GenAI span name such as ``execute_tool grep``, as
  OpenLLMetry starts its spans, or ``openinference.span.kind`` among the start attributes) gives
  ``tool.start`` / ``llm.start`` at ``on_start`` and the end event at ``on_end``;
- a span whose kind is known only at its end (OpenInference's LangChain instrumentor sets every
  attribute then) gives both at ``on_end``, stamped with the span's own start and end times.

At the start a span rarely carries its session yet; the instrumentors keep it in the OpenTelemetry
context instead, which is read then: OpenLLMetry's association properties (LangChain metadata,
``Traceloop.set_association_properties``) and OpenInference's ``using_session``. An explicitly
bound ``maitred.program(...)`` wins over both.

The processor never raises into the instrumented app (failures are logged at debug level) and a
span that is no tool or model call costs a few dictionary lookups at its start and end.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from maitred.integrations.otel_spans import (
    Opened,
    SpanRecord,
    end_event,
    kind_of,
    open_call,
    outcome,
    span_events,
    start_event,
)
from maitred.middleware.config import emit, flush
from maitred.middleware.context import current_scope

__all__ = ["MaitredSpanProcessor"]

log = logging.getLogger("maitred")

#: Calls open at once past which new ones are recorded at their end only (a guard against spans
#: that are never ended keeping their entries forever).
MAX_OPEN = 100_000
#: OpenLLMetry's context key for association properties, and OpenInference's for the session.
_ASSOCIATION_KEY = "association_properties"
_SESSION_KEY = "session.id"


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _context_attributes(parent: otel_context.Context | None) -> dict[str, Any]:
    """The session the instrumentors keep in the context at a span's start, under the attribute
    names the span itself would carry (``otel_spans.PROGRAM_ATTRIBUTES``)."""
    found: dict[str, Any] = {}
    association = otel_context.get_value(_ASSOCIATION_KEY, parent)
    if isinstance(association, Mapping):
        for key, value in association.items():
            found[f"traceloop.association.properties.{key}"] = value
    session = otel_context.get_value(_SESSION_KEY, parent)
    if session is not None:
        found[_SESSION_KEY] = session
    return found


def _outcome(span: ReadableSpan) -> tuple[bool, str | None]:
    exception_type = None
    for event in span.events:
        if event.name == "exception" and event.attributes:
            exception_type = event.attributes.get("exception.type") or exception_type
    return outcome(span.status.status_code.name.lower(), exception_type, span.attributes or {})


def _record(span: ReadableSpan) -> SpanRecord:
    context = span.context
    start, end = span.start_time or 0, span.end_time or span.start_time or 0
    failed, error_type = _outcome(span)
    return SpanRecord(
        name=span.name,
        trace_id=_hex(context.trace_id, 32),
        span_id=_hex(context.span_id, 16),
        start_s=start / 1e9,
        end_s=end / 1e9,
        attributes=span.attributes or {},
        failed=failed,
        error_type=error_type,
    )


class MaitredSpanProcessor(SpanProcessor):
    """Tool and model spans to maitred events, live (see the module docstring).

    ``record_model_calls=False`` leaves model calls out, for agents whose model is served through
    the maitred gateway, which records them itself."""

    def __init__(self, *, record_model_calls: bool = True) -> None:
        self.record_model_calls = record_model_calls
        self._open: dict[int, tuple[Opened, float]] = {}
        self._stopped = False

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        if self._stopped:
            return
        try:
            self._started(span, parent_context)
        except Exception:  # telemetry never reaches the agent
            log.debug("maitred: span start not recorded", exc_info=True)

    def _started(self, span: Span, parent_context: otel_context.Context | None) -> None:
        attributes = span.attributes or {}
        kind = kind_of(span.name, attributes)
        if kind is None or (kind == "llm" and not self.record_model_calls) or len(self._open) >= MAX_OPEN:
            return
        bound = current_scope.get()
        known = {**_context_attributes(parent_context), **attributes}
        context = span.get_span_context()
        call = open_call(
            kind,
            span.name,
            known,
            trace_id=_hex(context.trace_id, 32),
            span_id=_hex(context.span_id, 16),
            program_id=bound.program_id if bound else None,
            agent=bound.agent if bound else None,
        )
        started = (span.start_time or 0) / 1e9
        self._open[context.span_id] = (call, started)
        emit(start_event(call, started, attributes))

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopped:
            return
        try:
            self._ended(span)
        except Exception:  # telemetry never reaches the agent
            log.debug("maitred: span end not recorded", exc_info=True)

    def _ended(self, span: ReadableSpan) -> None:
        context = span.context
        opened = self._open.pop(context.span_id, None) if self._open else None
        if opened is not None:
            call, started = opened
            failed, error_type = _outcome(span)
            end = (span.end_time or 0) / 1e9
            emit(end_event(call, end, started, span.attributes or {}, failed=failed, error_type=error_type))
            return
        if kind_of(span.name, span.attributes or {}) is None:
            return
        bound = current_scope.get()
        for event in span_events(
            _record(span),
            program_id=bound.program_id if bound else None,
            agent=bound.agent if bound else None,
            record_model_calls=self.record_model_calls,
        ):
            emit(event)

    def shutdown(self) -> None:
        """Stop recording (the provider shuts down): spans still ended later give nothing."""
        self._stopped = True
        self._open.clear()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait until what the spans gave is stored (``maitred.flush``)."""
        return flush(timeout=timeout_millis / 1000)
