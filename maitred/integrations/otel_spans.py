"""OpenTelemetry spans of tool and model calls as maitred events: the one mapping that the span
processor (``maitred.integrations.otel``) and the gateway's OTLP receiver
(``maitred.gateway.otlp_receiver``) share. Pure: no OpenTelemetry import, so the gateway can
load it without the ``otel`` extra.

Agent frameworks are often instrumented already, by OpenInference (Arize) or OpenLLMetry
(Traceloop) instrumentors, or by hand after the GenAI semantic conventions. What each names:

- **The kind of span.** ``openinference.span.kind`` ``TOOL`` or ``LLM``; ``gen_ai.operation.name``
  ``execute_tool``, or a model operation (``chat``, ``text_completion``, ``generate_content``);
  ``traceloop.span.kind`` ``tool``; else the span name, as the GenAI conventions form it
  (``execute_tool grep``, ``chat gpt-4o``) or OpenLLMetry's ``ChatOpenAI.chat`` and
  ``OpenAI.completion``. ``CHAIN``, ``AGENT``, ``task`` and ``workflow`` spans are no calls and
  are left alone, as is every span that names none of these.
- **The tool**: ``tool.name``, ``gen_ai.tool.name``, OpenLLMetry's ``traceloop.entity.name``, or
  the name after ``execute_tool``; its call id ``gen_ai.tool.call.id`` or ``tool_call.id``, else
  the span id (so start and end pair up either way).
- **The model call**: the model from ``llm.model_name``, ``gen_ai.request.model`` or
  ``gen_ai.response.model`` (not OpenLLMetry's ``unknown``); prompt, completion and cached tokens
  from ``llm.token_count.*`` or ``gen_ai.usage.*``; the request id is the span id, and the trace
  id goes on ``llm.start`` and ``llm.end`` as ``trace_id``.
- **The outcome**: an error status, or an unset status with an ``exception`` event, is an error;
  a ``TimeoutError`` a tool timeout and a cancellation an interruption (``exception.type`` or
  ``error.type``).

Program id, in this order (the same rules as the rest of maitred, ``docs/program-ids.md``):

1. an explicitly bound ``maitred.program(...)`` (the processor only: it runs in the agent's
   process, and the bound program's agent comes with it);
2. a session the span names: LangGraph's ``config["metadata"]["program_id"]`` (which maitred's
   LangGraph adapters read too), as OpenLLMetry records it
   (``traceloop.association.properties.program_id``) or OpenInference (in its ``metadata`` JSON);
   then ``session.id`` (OpenInference), ``gen_ai.conversation.id`` (GenAI conventions), and
   OpenLLMetry's association properties ``session_id``, ``thread_id``, ``conversation_id``;
3. else the trace id (32 hex digits): one trace, one program.

The agent is ``gen_ai.agent.name`` or LangChain's ``lc_agent_name`` association property.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from maitred.events import Event, LLMEnd, LLMStart, ToolEnd, ToolStart

__all__ = [
    "PROGRAM_ATTRIBUTES",
    "Kind",
    "Opened",
    "SpanRecord",
    "end_event",
    "kind_of",
    "open_call",
    "outcome",
    "span_events",
    "start_event",
]

Kind = Literal["tool", "llm"]

_OPENINFERENCE_KINDS: dict[Any, Kind] = {"TOOL": "tool", "LLM": "llm"}
_GENAI_OPERATIONS: dict[Any, Kind] = {
    "execute_tool": "tool",
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
}
_TRACELOOP_KINDS: dict[Any, Kind] = {"tool": "tool"}
_KIND_ATTRIBUTES = (
    ("openinference.span.kind", _OPENINFERENCE_KINDS),
    ("gen_ai.operation.name", _GENAI_OPERATIONS),
    ("traceloop.span.kind", _TRACELOOP_KINDS),
)
#: OpenLLMetry names its LLM spans ``{class}.{type}`` (GenAI span names are ``{operation} {target}``).
_LLM_SUFFIXES = (".chat", ".completion")

_ASSOCIATION = "traceloop.association.properties."
#: Where a span names its session, in the order read (the module docstring's rule 2).
PROGRAM_ATTRIBUTES = (
    f"{_ASSOCIATION}program_id",
    "session.id",
    "gen_ai.conversation.id",
    f"{_ASSOCIATION}session_id",
    f"{_ASSOCIATION}thread_id",
    f"{_ASSOCIATION}conversation_id",
)
_AGENT_ATTRIBUTES = ("gen_ai.agent.name", f"{_ASSOCIATION}lc_agent_name")
_TOOL_ATTRIBUTES = ("tool.name", "gen_ai.tool.name")
_CALL_ID_ATTRIBUTES = ("gen_ai.tool.call.id", "tool_call.id")
_MODEL_ATTRIBUTES = ("llm.model_name", "gen_ai.request.model", "gen_ai.response.model")
_PROMPT_TOKENS = ("llm.token_count.prompt", "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
_COMPLETION_TOKENS = ("llm.token_count.completion", "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
_CACHED_TOKENS = (
    "llm.token_count.prompt_details.cache_read",
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
)
_TIMEOUTS = frozenset({"TimeoutError", "asyncio.TimeoutError", "concurrent.futures.TimeoutError", "builtins.TimeoutError"})
_CANCELLATIONS = frozenset({"CancelledError", "asyncio.CancelledError", "asyncio.exceptions.CancelledError", "KeyboardInterrupt"})


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """What the mapping reads of one finished span, however it arrived (the SDK's
    ``ReadableSpan``, an OTLP protobuf or JSON span). Ids are lower-case hex; times are unix
    seconds; ``error_type`` is the exception's type name when one was recorded."""

    name: str
    trace_id: str
    span_id: str
    start_s: float
    end_s: float
    attributes: Mapping[str, Any]
    failed: bool = False
    error_type: str | None = None


@dataclass(frozen=True, slots=True)
class Opened:
    """A tool or model call as its span started: what its end event must repeat."""

    kind: Kind
    program_id: str
    agent: str | None
    call_id: str  # the tool call id, or the model call's request id
    name: str | None  # the tool, or the model
    trace_id: str


def _first(attributes: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = attributes.get(name)
        if value is not None and value != "":
            return value
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def outcome(status: str, exception_type: Any, attributes: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether a span failed, and the type of its exception: ``status`` is the span's status code
    (``unset``, ``ok``, ``error``), ``exception_type`` that of its last ``exception`` event. An
    unset status with an exception recorded (or OpenLLMetry's ``error.type``) is a failure too;
    an ``ok`` one is not (the exception was handled)."""
    error_type = exception_type or attributes.get("error.type")
    error_type = error_type if isinstance(error_type, str) else None
    return status == "error" or (status == "unset" and error_type is not None), error_type


def kind_of(name: str, attributes: Mapping[str, Any]) -> Kind | None:
    """``tool``, ``llm``, or None for a span that is neither: most spans, which cost a few
    lookups (none in their attributes while they have none, as most spans at their start)."""
    if attributes:
        for key, table in _KIND_ATTRIBUTES:
            value = attributes.get(key)
            if value is not None:
                return table.get(value)  # a kind that names something else (CHAIN, task) is no call
    operation, space, _ = name.partition(" ")
    if space:
        return _GENAI_OPERATIONS.get(operation)
    return "llm" if name.endswith(_LLM_SUFFIXES) else None


def _after_operation(name: str) -> str | None:
    """``grep`` of the span name ``execute_tool grep`` (the GenAI conventions' form)."""
    operation, _, target = name.partition(" ")
    return (target.strip() or None) if operation in _GENAI_OPERATIONS else None


def _tool_name(name: str, attributes: Mapping[str, Any]) -> str:
    found = _text(_first(attributes, _TOOL_ATTRIBUTES))
    if found is None and attributes.get("traceloop.span.kind") == "tool":
        found = _text(attributes.get("traceloop.entity.name"))
    return found or _after_operation(name) or name


def _model(name: str, attributes: Mapping[str, Any]) -> str | None:
    for key in _MODEL_ATTRIBUTES:
        value = _text(attributes.get(key))
        if value is not None and value != "unknown":  # OpenLLMetry's word for a model it could not tell
            return value
    return _after_operation(name)


def _metadata_program(attributes: Mapping[str, Any]) -> str | None:
    """``program_id`` of the LangChain metadata OpenInference records as one JSON string."""
    metadata = attributes.get("metadata")
    if not isinstance(metadata, str) or '"program_id"' not in metadata:
        return None
    try:
        decoded = json.loads(metadata)
    except ValueError:
        return None
    return _text(decoded.get("program_id")) if isinstance(decoded, dict) else None


def _program(attributes: Mapping[str, Any]) -> str | None:
    """The session a span names (the module docstring's rule 2)."""
    return (
        _text(attributes.get(PROGRAM_ATTRIBUTES[0]))
        or _metadata_program(attributes)
        or _text(_first(attributes, PROGRAM_ATTRIBUTES[1:]))
    )


def open_call(
    kind: Kind,
    name: str,
    attributes: Mapping[str, Any],
    *,
    trace_id: str,
    span_id: str,
    program_id: str | None = None,
    agent: str | None = None,
) -> Opened:
    """The call a span of ``kind`` stands for. ``program_id`` (and its ``agent``) is an
    explicitly bound program, which wins; otherwise the span's session, else its trace."""
    program = program_id or _program(attributes) or trace_id
    who = agent if program_id else _text(_first(attributes, _AGENT_ATTRIBUTES))
    if kind == "tool":
        call_id = _text(_first(attributes, _CALL_ID_ATTRIBUTES)) or span_id
        return Opened(kind, program, who, call_id, _tool_name(name, attributes), trace_id)
    return Opened(kind, program, who, span_id, _model(name, attributes), trace_id)


def start_event(call: Opened, ts: float, attributes: Mapping[str, Any] | None = None) -> Event:
    """``tool.start`` or ``llm.start`` (with the prompt tokens when the span already counts them)."""
    if call.kind == "tool":
        return ToolStart(ts=ts, program_id=call.program_id, agent=call.agent, call_id=call.call_id, tool=call.name or "tool")
    prompt = _first(attributes, _PROMPT_TOKENS) if attributes else None
    return LLMStart(
        ts=ts,
        program_id=call.program_id,
        agent=call.agent,
        request_id=call.call_id,
        model=call.name,
        prompt_tokens=prompt,
        trace_id=call.trace_id,
    )


def _tool_status(failed: bool, error_type: str | None) -> Literal["ok", "error", "timeout", "interrupted"]:
    if not failed:
        return "ok"
    if error_type in _TIMEOUTS:
        return "timeout"
    return "interrupted" if error_type in _CANCELLATIONS else "error"


def end_event(
    call: Opened,
    ts: float,
    started: float,
    attributes: Mapping[str, Any],
    *,
    failed: bool = False,
    error_type: str | None = None,
) -> Event:
    """``tool.end`` or ``llm.end`` from the span as it ended (its final attributes)."""
    if call.kind == "tool":
        return ToolEnd(
            ts=ts,
            program_id=call.program_id,
            agent=call.agent,
            call_id=call.call_id,
            status=_tool_status(failed, error_type),
            duration_s=max(0.0, ts - started),
        )
    status: Literal["ok", "error", "cancelled"] = "ok"
    if failed:
        status = "cancelled" if error_type in _CANCELLATIONS else "error"
    return LLMEnd(
        ts=ts,
        program_id=call.program_id,
        agent=call.agent,
        request_id=call.call_id,
        prompt_tokens=_first(attributes, _PROMPT_TOKENS) or 0,
        completion_tokens=_first(attributes, _COMPLETION_TOKENS) or 0,
        cached_tokens=_first(attributes, _CACHED_TOKENS),
        status=status,
        trace_id=call.trace_id,
    )


def span_events(
    span: SpanRecord, *, program_id: str | None = None, agent: str | None = None, record_model_calls: bool = True
) -> list[Event]:
    """The start and end events of a finished span (none for a span that is no tool or model
    call), stamped with the span's own start and end times."""
    kind = kind_of(span.name, span.attributes)
    if kind is None or (kind == "llm" and not record_model_calls):
        return []
    call = open_call(
        kind, span.name, span.attributes, trace_id=span.trace_id, span_id=span.span_id, program_id=program_id, agent=agent
    )
    end = end_event(call, span.end_s, span.start_s, span.attributes, failed=span.failed, error_type=span.error_type)
    return [start_event(call, span.start_s, span.attributes), end]
