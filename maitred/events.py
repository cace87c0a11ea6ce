"""The one event vocabulary of maitred (SPEC section 4).

Everything that crosses a process boundary — middleware to store, middleware to runtime, hooks to
runtime, store to trace file — is one of these events. Instances are plain frozen dataclasses so
that the middleware can build them in a microsecond on the agent's hot path; validation happens
only at the edges (``decode_event`` / ``decode_batch``), where input is untrusted, and names the
offending field in every message.
"""

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError

SCHEMA_VERSION = 1
MAX_ID_LENGTH = 256
#: Clocks drift; an event stamped further ahead than this is a bug in the sender, not skew.
MAX_FUTURE_SKEW_S = 300.0

# Strict per field: a string is never read as a number nor the reverse (an int is a valid float).
Id = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_ID_LENGTH)]
Name = Annotated[str, Strict(), Field(max_length=MAX_ID_LENGTH)]
Seconds = Annotated[float, Strict()]
NonNegative = Annotated[float, Strict(), Field(ge=0)]
Tokens = Annotated[int, Strict(), Field(ge=0)]
Flag = Annotated[bool, Strict()]

_STRICT = ConfigDict(extra="forbid")


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Fields every event carries. ``type`` is the class's ``TYPE``, not a field."""

    TYPE: ClassVar[str] = ""
    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    ts: Seconds
    program_id: Id
    agent: Id | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramStart(Event):
    TYPE: ClassVar[str] = "program.start"
    parent_program_id: Id | None = None
    framework: Name | None = None
    attrs: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramEnd(Event):
    TYPE: ClassVar[str] = "program.end"
    status: Literal["ok", "error", "cancelled"] = "ok"


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMStart(Event):
    TYPE: ClassVar[str] = "llm.start"
    request_id: Id
    model: Name | None = None
    prompt_tokens: Tokens | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMEnd(Event):
    TYPE: ClassVar[str] = "llm.end"
    request_id: Id
    prompt_tokens: Tokens
    completion_tokens: Tokens
    cached_tokens: Tokens | None = None
    worker: Annotated[str, Strict(), Field(max_length=1024)] | None = None
    ttft_s: NonNegative | None = None
    status: Literal["ok", "error", "cancelled"] = "ok"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStart(Event):
    TYPE: ClassVar[str] = "tool.start"
    call_id: Id
    tool: Id
    signature: Id | None = None
    deadline_s: Annotated[float, Strict(), Field(gt=0)] | None = None
    background: Flag = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolProgress(Event):
    TYPE: ClassVar[str] = "tool.progress"
    call_id: Id
    fraction: Annotated[float, Strict(), Field(ge=0, le=1)] | None = None
    eta_s: NonNegative | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolEnd(Event):
    TYPE: ClassVar[str] = "tool.end"
    call_id: Id
    status: Literal["ok", "error", "timeout", "interrupted"] = "ok"
    duration_s: NonNegative | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Handoff(Event):
    """Control passes between agents; ``messages`` (or their size and hash) is the shared context."""

    TYPE: ClassVar[str] = "handoff"
    from_agent: Id
    to_agent: Id
    child_program_id: Id | None = None
    messages: list[dict[str, Any]] | None = None
    context_tokens: Tokens | None = None
    context_hash: Name | None = None
    expected_prompt: Annotated[str, Strict()] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramWait(Event):
    """The program waits on a human or an external event (e.g. Claude Code's ``Stop``)."""

    TYPE: ClassVar[str] = "program.wait"
    reason: Name | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramResume(Event):
    TYPE: ClassVar[str] = "program.resume"


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterPublish(Event):
    """A LoRA adapter was republished: KV computed under an older version is stale (LOCAL)."""

    TYPE: ClassVar[str] = "adapter.publish"
    adapter: Id
    version: Id


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        ProgramStart, ProgramEnd, LLMStart, LLMEnd, ToolStart, ToolProgress, ToolEnd,
        Handoff, ProgramWait, ProgramResume, AdapterPublish,
    )
}
_FIELDS: dict[str, tuple[str, ...]] = {name: tuple(f.name for f in fields(cls)) for name, cls in EVENT_TYPES.items()}
_UNKNOWN_FIELD = ("unexpected_keyword_argument", "extra_forbidden")
_ADAPTERS: dict[str, TypeAdapter[Any]] = {name: TypeAdapter(cls) for name, cls in EVENT_TYPES.items()}


class EventError(ValueError):
    """An event that cannot be accepted; ``field`` names where the problem is (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


@dataclass(frozen=True, slots=True)
class Rejected:
    """One event of a batch that was refused, by position, with the reason."""

    index: int
    field: str
    reason: str

    def message(self) -> str:
        return f"event[{self.index}].{self.field}: {self.reason}"


@dataclass(slots=True)
class Batch:
    """A decoded batch: the good events, and the bad ones with why."""

    events: list[Event] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


def decode_event(data: Any, *, now: float | None = None) -> Event:
    """Validate one event given as a JSON object; raise ``EventError`` naming the field."""
    if not isinstance(data, Mapping):
        raise EventError("event", f"expected a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise EventError("type", "missing or not a string")
    if kind not in EVENT_TYPES:
        raise EventError("type", f"unknown event type {kind[:64]!r}; known: {', '.join(EVENT_TYPES)}")
    version = data.get("v", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise EventError("v", f"unsupported schema version {version!r}; this build speaks {SCHEMA_VERSION}")
    body = {k: v for k, v in data.items() if k not in ("type", "v")}
    try:
        event: Event = _ADAPTERS[kind].validate_python(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "event"
        message = "unknown field" if first["type"] in _UNKNOWN_FIELD else first["msg"]
        raise EventError(where, f"{message} (in {kind})") from None
    _check_ts(event.ts, time.time() if now is None else now)
    return event


def _check_ts(ts: float, now: float) -> None:
    if not math.isfinite(ts) or ts <= 0:
        raise EventError("ts", f"must be a positive unix time in seconds, got {ts!r}")
    if ts > now + MAX_FUTURE_SKEW_S:
        raise EventError("ts", f"{ts:.3f} is {ts - now:.0f} s in the future (limit {MAX_FUTURE_SKEW_S:.0f} s)")


def decode_batch(items: Iterable[Any], *, now: float | None = None) -> Batch:
    """Validate every item; bad ones are reported by index and never drop the good ones."""
    now = time.time() if now is None else now
    batch = Batch()
    for index, item in enumerate(items):
        try:
            batch.events.append(decode_event(item, now=now))
        except EventError as exc:
            batch.rejected.append(Rejected(index, exc.field, exc.reason))
    return batch


def loads_batch(body: bytes | str, *, now: float | None = None) -> Batch:
    """Parse a batch sent as a JSON array, a single JSON object, or NDJSON (one event per line)."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    stripped = text.strip()
    if not stripped:
        return Batch()
    if stripped[0] == "[":
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise EventError("body", f"invalid JSON array: {exc}") from None
        return decode_batch(items, now=now)
    lines: list[Any] = []
    bad_json: list[Rejected] = []
    for index, line in enumerate(l for l in stripped.splitlines() if l.strip()):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError as exc:
            bad_json.append(Rejected(index, "line", f"invalid JSON: {exc}"))
            lines.append(None)
    batch = decode_batch(lines, now=now)
    bad_at = {r.index for r in bad_json}
    batch.rejected = sorted(bad_json + [r for r in batch.rejected if r.index not in bad_at], key=lambda r: r.index)
    return batch


def encode_event(event: Event) -> dict[str, Any]:
    """The wire form: ``v`` and ``type`` first, then the set fields (``None`` left out).

    Values are shared with the event, not copied (``dataclasses.asdict`` deep-copies and was
    most of the store's ingest time); events are frozen, so nothing mutates them.
    """
    out: dict[str, Any] = {"v": SCHEMA_VERSION, "type": event.TYPE}
    for name in _FIELDS[event.TYPE]:
        value = getattr(event, name)
        if value is not None:
            out[name] = value
    return out


def dumps_batch(events: Iterable[Event], *, ndjson: bool = False) -> str:
    encoded = [encode_event(e) for e in events]
    if ndjson:
        return "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in encoded)
    return json.dumps(encoded, separators=(",", ":"))


#: maitred field -> OpenTelemetry GenAI semantic-convention attribute, where one exists.
OTEL_ATTRIBUTES: dict[str, str] = {
    "program_id": "gen_ai.conversation.id",
    "agent": "gen_ai.agent.name",
    "tool": "gen_ai.tool.name",
    "call_id": "gen_ai.tool.call.id",
    "model": "gen_ai.request.model",
    "request_id": "gen_ai.response.id",
    "prompt_tokens": "gen_ai.usage.input_tokens",
    "completion_tokens": "gen_ai.usage.output_tokens",
    "cached_tokens": "gen_ai.usage.cache_read.input_tokens",
}


def to_otel_attributes(event: Event) -> dict[str, Any]:
    """Span attributes for an optional OTel export: GenAI names where defined, ``maitred.*`` else.

    Values OTel attributes cannot hold (lists of messages, dicts) are left out; the event log
    keeps them.
    """
    attrs: dict[str, Any] = {"maitred.event.type": event.TYPE}
    for key, value in encode_event(event).items():
        if key in ("v", "type") or isinstance(value, (list, dict)):
            continue
        attrs[OTEL_ATTRIBUTES.get(key, f"maitred.{key}")] = value
    return attrs
