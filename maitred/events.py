"""The one event vocabulary of maitred (SPEC section 4).

Everything that crosses a process boundary — middleware to store, middleware to runtime, hooks to
runtime, store to trace file — is one of these events, and the names those boundaries share (the
program-id headers, the trace format) are defined here too, once. Instances are plain frozen dataclasses so
that the middleware can build them in a microsecond on the agent's hot path; validation happens
only at the edges (``decode_event`` / ``decode_batch``), where input is untrusted, and names the
offending field in every message.

Validation refuses everything the store cannot hold, so that a batch that passed it is never
refused by the database for one bad value (which used to fail the whole batch on every retry):

- counts (``*_tokens``) are integers from 0 to 2**63 - 1, what a 64-bit column holds;
- numbers are finite (JSON has no NaN or Infinity, and the event body is stored as JSON);
- no string, anywhere, holds a NUL byte (PostgreSQL refuses them in text) or a lone surrogate
  (not UTF-8: neither database nor the JSON encoder takes it);
- ``attrs`` and ``messages`` (free-form JSON) nest at most ``MAX_NESTING`` containers deep (the
  field itself counts as one), hold only integers that fit 64 signed bits, and encode to at most
  ``MAX_ATTRS_BYTES`` (64 KiB: metadata) and ``MAX_MESSAGES_BYTES`` (8 MiB: a shared context of
  about two million tokens) of JSON; ``expected_prompt`` holds at most ``MAX_PROMPT_CHARS``.

``loads_batch`` parses untrusted bodies one line (NDJSON) or one element (JSON array) at a time,
so a line that cannot be parsed at all (100,000 nested brackets, bytes that are not UTF-8, an
integer of 5,000 digits) is rejected alone by position.
"""

import json
import math
import re
import reprlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError

from maitred.identity import header_names

SCHEMA_VERSION = 1
MAX_ID_LENGTH = 256
#: The HTTP headers a client may name its program in, in the order they are read (SPEC 7.5):
#: the headers of ``maitred.identity.ID_SOURCES`` (maitred's own first). Lower case, as ASGI
#: servers deliver header names; a plain mapping of headers must be lowered before it is looked up.
PROGRAM_ID_HEADERS = header_names()
#: The header line of a ``maitred export`` trace file (docs/trace-format.md): its ``format`` and
#: ``version``, written by the store and checked by the simulator's reader.
TRACE_FORMAT = "maitred-trace"
TRACE_VERSION = 1
#: The ``program.wait`` reason of a program that stopped on its own background work (Claude
#: Code's ``Stop`` while subagents or background commands still run): it resumes by itself.
BACKGROUND_WAIT = "background"
#: Clocks drift; an event stamped further ahead than this is a bug in the sender, not skew.
MAX_FUTURE_SKEW_S = 300.0
#: Integers the store holds: 64-bit signed columns (SQLite INTEGER, PostgreSQL BIGINT).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Free-form JSON (``attrs``, ``messages``) nests at most this many containers deep.
MAX_NESTING = 32
MAX_ATTRS_BYTES = 64 * 1024
MAX_MESSAGES_BYTES = 8 * 1024 * 1024
MAX_PROMPT_CHARS = 8 * 1024 * 1024

# Strict per field: a string is never read as a number nor the reverse (an int is a valid float).
Id = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_ID_LENGTH)]
Name = Annotated[str, Strict(), Field(max_length=MAX_ID_LENGTH)]
Seconds = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Tokens = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
Flag = Annotated[bool, Strict()]
#: A W3C trace id (32 lower-case hex digits): the trace a model call ran in, as the caller's
#: ``traceparent`` or the OpenTelemetry span it was read from names it.
TraceId = Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{32}$")]

# Instances are re-checked field by field when given to an adapter (``check_event``).
_STRICT = ConfigDict(extra="forbid", revalidate_instances="always")


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
    trace_id: TraceId | None = None


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
    trace_id: TraceId | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStart(Event):
    TYPE: ClassVar[str] = "tool.start"
    call_id: Id
    tool: Id
    signature: Id | None = None
    deadline_s: Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)] | None = None
    background: Flag = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolProgress(Event):
    TYPE: ClassVar[str] = "tool.progress"
    call_id: Id
    fraction: Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)] | None = None
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
    expected_prompt: Annotated[str, Strict(), Field(max_length=MAX_PROMPT_CHARS)] | None = None


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
        ProgramStart,
        ProgramEnd,
        LLMStart,
        LLMEnd,
        ToolStart,
        ToolProgress,
        ToolEnd,
        Handoff,
        ProgramWait,
        ProgramResume,
        AdapterPublish,
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


#: Free-form fields: their JSON is walked for what the store cannot hold, with a size limit each.
_JSON_LIMITS = {"attrs": MAX_ATTRS_BYTES, "messages": MAX_MESSAGES_BYTES}
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 64


def _name(part: Any) -> str:
    """A path element fit for a one-line message (keys come from the sender and may be anything)."""
    text = str(part)
    return text if len(text) <= 64 and text.isprintable() else _short.repr(text)


def decode_event(data: Any, *, now: float | None = None) -> Event:
    """Validate one event given as a JSON object; raise ``EventError`` naming the field."""
    if not isinstance(data, Mapping):
        raise EventError("event", f"expected a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise EventError("type", "missing or not a string")
    if kind not in EVENT_TYPES:
        raise EventError("type", f"unknown event type {_short.repr(kind)}; known: {', '.join(EVENT_TYPES)}")
    version = data.get("v", SCHEMA_VERSION)
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise EventError("v", f"unsupported schema version {_short.repr(version)}; this build speaks {SCHEMA_VERSION}")
    body = {k: v for k, v in data.items() if k not in ("type", "v")}
    try:
        event: Event = _ADAPTERS[kind].validate_python(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(_name(p) for p in first["loc"]) or "event"
        message = "unknown field" if first["type"] in _UNKNOWN_FIELD else first["msg"]
        raise EventError(where, f"{message} (in {kind})") from None
    _check_ts(event.ts, time.time() if now is None else now)
    _check_values(kind, body.items())
    return event


def check_event(event: Event, *, now: float | None = None) -> None:
    """Validate an event built in-process (the hot path skips this) exactly as ``decode_event``
    would its wire form, without building the wire form; raise ``EventError`` naming the field."""
    kind = event.TYPE
    try:
        _ADAPTERS[kind].validate_python(event)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise EventError(".".join(_name(p) for p in first["loc"]) or "event", f"{first['msg']} (in {kind})") from None
    _check_ts(event.ts, time.time() if now is None else now)
    _check_values(kind, ((name, getattr(event, name)) for name in _FIELDS[kind]))


def _check_values(kind: str, items: Iterable[tuple[str, Any]]) -> None:
    """What the schema cannot say: text the store can hold, and bounded free-form JSON."""
    for name, value in items:
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem:
                raise EventError(name, f"{problem} (in {kind})")
        elif name in _JSON_LIMITS and value is not None:
            _check_json_field(name, value, kind)


def _check_ts(ts: float, now: float) -> None:
    if not math.isfinite(ts) or ts <= 0:
        raise EventError("ts", f"must be a positive unix time in seconds, got {ts!r}")
    if ts > now + MAX_FUTURE_SKEW_S:
        raise EventError("ts", f"{ts:.3f} is {ts - now:.0f} s in the future (limit {MAX_FUTURE_SKEW_S:.0f} s)")


def name_problem(value: object, *, empty: bool = True) -> str | None:
    """Why ``value`` cannot be an id or a name in an event (what ``decode_event`` checks of
    one), or None: for the gateway, which takes model names and program ids from model requests
    and must refuse at the edge what the store would later fail to hold."""
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    if len(value) > MAX_ID_LENGTH:
        return f"longer than {MAX_ID_LENGTH} characters ({len(value):,})"
    if not value and not empty:
        return "empty"
    return _text_problem(value)


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL byte, which the store cannot hold"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid UTF-8 (a lone surrogate, or bytes that were not UTF-8)"
    return None


class _Unstorable(Exception):
    """Raised inside the JSON walk; ``path`` is filled in as it unwinds, so a successful walk
    never pays for building path strings."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.path: list[str] = []


def _walk(value: Any, depth: int) -> None:
    if isinstance(value, str):
        problem = _text_problem(value)
        if problem:
            raise _Unstorable(problem)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise _Unstorable("integer out of the 64-bit range the store holds")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Unstorable(f"{value!r} is not a finite number (JSON has no NaN or Infinity)")
    elif isinstance(value, (Mapping, list, tuple)):
        if depth > MAX_NESTING:
            raise _Unstorable(f"nested deeper than {MAX_NESTING} levels")
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, item in items:
            try:
                if isinstance(key, str):
                    problem = _text_problem(key)
                    if problem:
                        raise _Unstorable(f"key {problem}")
                _walk(item, depth + 1)
            except _Unstorable as exc:
                exc.path.append(_name(key))
                raise


def _check_json_field(name: str, value: Any, kind: str) -> None:
    try:
        _walk(value, 1)
    except _Unstorable as exc:
        where = ".".join([name, *reversed(exc.path)])
        if len(where) > 160:
            where = f"{where[:80]}...{where[-60:]}"
        raise EventError(where, f"{exc.reason} (in {kind})") from None
    try:
        size = len(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        raise EventError(name, f"cannot be stored as JSON: {exc} (in {kind})") from None
    if size > _JSON_LIMITS[name]:
        raise EventError(name, f"{size} bytes of JSON, more than the {_JSON_LIMITS[name]} allowed (in {kind})")


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


def loads_batch(body: bytes | str, *, now: float | None = None, whole_limit: int | None = None) -> Batch:
    """Parse a batch sent as a JSON array, a single JSON object, or NDJSON (one event per line).

    Each NDJSON line and each array element is parsed on its own: one that is not JSON, not
    UTF-8, or nested past what the parser can take is rejected by position (field ``line`` or
    ``element``) and the others are kept. A body that is not one JSON array is read as NDJSON;
    only a one-line body starting with ``[`` whose brackets do not balance is refused as a
    whole (``EventError`` on ``body``).

    An array longer than ``whole_limit`` characters is split into its elements before parsing,
    never parsed in one call: the same batch, in steps no larger than one event, so a thread
    parsing it hands the interpreter back to an event loop beside it (one parser call over a
    14 MB array holds it for over 100 ms).
    """
    # Bytes that are not UTF-8 become lone surrogates, which validation refuses per event.
    text = body.decode("utf-8", "surrogateescape") if isinstance(body, bytes) else body
    stripped = text.strip()
    if not stripped:
        return Batch()
    if stripped[0] in "[{":
        whole = None
        if stripped[0] == "{" or whole_limit is None or len(stripped) <= whole_limit:
            try:
                whole = json.loads(stripped)
            except (ValueError, RecursionError):
                pass
        if isinstance(whole, (list, dict)):  # one array, or one (maybe pretty-printed) object
            return decode_batch(whole if isinstance(whole, list) else [whole], now=now)
        if stripped[0] == "[":
            try:
                return _parse_each(_array_elements(stripped), "element", now)
            except EventError:
                if "\n" not in stripped:
                    raise
    lines = [line for line in stripped.split("\n") if line.strip()]
    return _parse_each(lines, "line", now)


def _parse_each(texts: list[str], what: str, now: float | None) -> Batch:
    parsed: list[Any] = []
    unparsable: dict[int, str] = {}
    for index, piece in enumerate(texts):
        try:
            parsed.append(json.loads(piece))
        except RecursionError:
            unparsable[index] = "nested too deeply to parse"
        except ValueError as exc:  # json.JSONDecodeError, or an integer of thousands of digits
            unparsable[index] = f"invalid JSON: {_short.repr(str(exc))}"
        else:
            continue
        parsed.append(None)
    batch = decode_batch(parsed, now=now)
    if unparsable:
        batch.rejected = sorted(
            [Rejected(i, what, reason) for i, reason in unparsable.items()]
            + [r for r in batch.rejected if r.index not in unparsable],
            key=lambda r: r.index,
        )
    return batch


#: A JSON string (escapes included; an unterminated one runs to the end, so that scanning stays
#: linear), or a bracket, brace or comma outside strings.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{},]', re.DOTALL)


def _array_elements(text: str) -> list[str]:
    """The top-level elements of a JSON array, as text, found by counting brackets outside
    strings (no recursion, so any depth is fine); each is then parsed, or refused, alone."""
    depth, start = 0, 1
    elements: list[str] = []
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
            if depth == 0:
                if text[match.end() :].strip():
                    raise EventError("body", "invalid JSON array: text after the closing bracket")
                last = text[start : match.start()]
                if elements or last.strip():
                    elements.append(last)
                return elements
        elif token == "," and depth == 1:
            elements.append(text[start : match.start()])
            start = match.end()
    raise EventError("body", "invalid JSON array: its brackets never close")


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
    """Span attributes for the OTLP export (``maitred.middleware.otlp``): GenAI names where
    defined, ``maitred.*`` else.

    Values OTel attributes cannot hold (lists of messages, dicts) are left out; the event log
    keeps them. ``ts`` is left out too: it is the time of the span or span event itself.
    """
    attrs: dict[str, Any] = {"maitred.event.type": event.TYPE}
    for key, value in encode_event(event).items():
        if key in ("v", "type", "ts") or isinstance(value, (list, dict)):
            continue
        attrs[OTEL_ATTRIBUTES.get(key, f"maitred.{key}")] = value
    return attrs
