"""``POST /v1/traces``: the gateway as an OTLP/HTTP trace receiver, so an OpenTelemetry collector
(or an SDK's exporter) can forward an instrumented agent's spans to maitred.

Both OTLP/HTTP encodings: binary protobuf (``application/x-protobuf``, an
``ExportTraceServiceRequest`` of ``opentelemetry-proto``) and JSON (``application/json``, the OTLP
JSON mapping: lowerCamelCase keys, trace and span ids in hex, enums as integers), each also
gzip-compressed (``Content-Encoding: gzip``, what the collector's ``otlphttp`` exporter sends by
default). Tool and model spans become the same events as the span processor's
(``maitred.integrations.otel_spans.span_events``); other spans are accepted and left alone.

Answers follow the OTLP/HTTP specification: 200 with an ``ExportTraceServiceResponse`` in the
request's encoding, its ``partial_success`` counting the spans refused (``rejected_spans``) with
a message naming the first one's problem (its position and field); 400 with a ``google.rpc.Status``
for a body that cannot be decoded; 415 for another content type or encoding. Tokens, scopes and the
body limit are those of ``POST /v1/events`` (``--max-events-mb``): a span naming a program outside
the token's scope is refused like an event would be. Without the ``otel`` extra
(``opentelemetry-proto``) the route answers 501 saying so.
"""

import base64
import importlib
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from maitred.events import Event, EventError, check_event
from maitred.gateway.front import GatewayApp
from maitred.gateway.guard import HTTPProblem, read_body
from maitred.gateway.ingest import guarded
from maitred.gateway.loop import LiveDriver
from maitred.gateway.offload import ingest_in_slices, off_loop
from maitred.gateway.trust import Scope, Tokens
from maitred.integrations.otel_spans import SpanRecord, outcome, span_events

log = logging.getLogger("maitred.service")

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: ``google.rpc.Code.INVALID_ARGUMENT``, the code of a ``Status`` answering an undecodable body.
INVALID_ARGUMENT = 3
#: ``opentelemetry.proto.trace.v1.Status.StatusCode`` values, by the names ``otel_spans.outcome`` reads.
_STATUS_CODES = {0: "unset", 1: "ok", 2: "error"}
MISSING = "POST /v1/traces needs opentelemetry-proto, which is not installed: pip install 'maitred[otel]'"


@dataclass(frozen=True, slots=True)
class _Proto:
    """The protobuf classes the receiver speaks (``opentelemetry-proto``, ``googleapis-common-protos``)."""

    request: Any
    response: Any
    status: Any
    json_format: Any


def _load_proto() -> _Proto | None:
    try:
        service = importlib.import_module("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
        status = importlib.import_module("google.rpc.status_pb2")
        json_format = importlib.import_module("google.protobuf.json_format")
    except ImportError:
        return None
    return _Proto(service.ExportTraceServiceRequest, service.ExportTraceServiceResponse, status.Status, json_format)


class Undecodable(ValueError):
    """The body is not an OTLP trace export in the encoding it claims."""


@dataclass(slots=True)
class Received:
    """What one export request gave: the events of its tool and model spans, and the spans refused."""

    events: list[Event] = field(default_factory=list)
    spans: int = 0
    rejected: int = 0
    first_problem: str | None = None

    def refuse(self, problem: str) -> None:
        self.rejected += 1
        if self.first_problem is None:
            self.first_problem = problem


# -- decoding ------------------------------------------------------------------------------------


def _hex_to_base64(value: Any) -> Any:
    """The OTLP JSON mapping writes ids in hex where proto3 JSON expects base64. An id that is
    not hex becomes empty, so its span is refused by name (``_ids``) instead of the whole body."""
    if not isinstance(value, str):
        return value
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except ValueError:
        return ""


def _fix_ids(document: Any) -> None:
    """Rewrite, in place, every span's and link's hex ids for ``json_format``."""
    for resource in document.get("resourceSpans") or () if isinstance(document, dict) else ():
        for scope in (resource.get("scopeSpans") or ()) if isinstance(resource, dict) else ():
            for span in (scope.get("spans") or ()) if isinstance(scope, dict) else ():
                if not isinstance(span, dict):
                    continue
                links = [link for link in span.get("links") or () if isinstance(link, dict)]
                for item in (span, *links):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in item:
                            item[key] = _hex_to_base64(item[key])


def decode(proto: _Proto, raw: bytes, media: str) -> Any:
    """An ``ExportTraceServiceRequest`` from a protobuf or OTLP JSON body, else ``Undecodable``."""
    message = proto.request()
    if media == PROTOBUF:
        try:
            message.ParseFromString(raw)
        except Exception as exc:  # google.protobuf.message.DecodeError, and RecursionError on nesting
            raise Undecodable(f"body: not an OTLP ExportTraceServiceRequest in protobuf ({exc})") from None
        return message
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Undecodable(f"body: invalid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise Undecodable(f"body: expected a JSON object, got {type(document).__name__}")
    _fix_ids(document)
    try:
        proto.json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (proto.json_format.ParseError, RecursionError) as exc:
        raise Undecodable(f"body: not an OTLP ExportTraceServiceRequest in JSON ({str(exc)[:300]})") from None
    return message


def inflate(raw: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent before ``Content-Encoding`` (none, or gzip), at most ``limit`` bytes."""
    if encoding in ("", "identity"):
        return raw
    if encoding != "gzip":
        raise HTTPProblem(415, f"content-encoding: expected gzip or none, got {encoding[:64]!r}", field="content-encoding")
    inflater = zlib.decompressobj(wbits=31)
    try:
        body = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise Undecodable(f"body: not valid gzip ({exc})") from None
    if len(body) > limit:
        raise HTTPProblem(413, f"body is over the limit of {limit:,} bytes once inflated", field="body", kind="request_too_large")
    if not inflater.eof:
        raise Undecodable("body: the gzip stream ends early")
    return body


# -- spans to events -----------------------------------------------------------------------------


def _value(any_value: Any) -> Any:
    """An OTLP ``AnyValue`` as a plain value (lists and maps nested, bytes in hex)."""
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    if which == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, which)


def _ids(span: Any) -> str | None:
    """Why the span's ids or times cannot be read, or None."""
    if len(span.trace_id) != 16 or not any(span.trace_id):
        return "traceId: not a trace id (16 bytes, 32 hex digits in JSON, not all zero)"
    if len(span.span_id) != 8 or not any(span.span_id):
        return "spanId: not a span id (8 bytes, 16 hex digits in JSON, not all zero)"
    if span.start_time_unix_nano <= 0:
        return "startTimeUnixNano: missing"
    if span.end_time_unix_nano < span.start_time_unix_nano:
        return "endTimeUnixNano: before startTimeUnixNano"
    return None


def _record(span: Any) -> SpanRecord:
    attributes = {kv.key: _value(kv.value) for kv in span.attributes}
    exception_type = None
    for event in span.events:
        if event.name == "exception":
            for kv in event.attributes:
                if kv.key == "exception.type":
                    exception_type = _value(kv.value)
    failed, error_type = outcome(_STATUS_CODES.get(span.status.code, "unset"), exception_type, attributes)
    return SpanRecord(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        start_s=span.start_time_unix_nano / 1e9,
        end_s=span.end_time_unix_nano / 1e9,
        attributes=attributes,
        failed=failed,
        error_type=error_type,
    )


def _spans(message: Any) -> Iterator[tuple[str, Any]]:
    for r, resource in enumerate(message.resource_spans):
        for s, scope in enumerate(resource.scope_spans):
            for p, span in enumerate(scope.spans):
                yield f"resourceSpans[{r}].scopeSpans[{s}].spans[{p}]", span


def receive(message: Any, scope: Scope) -> Received:
    """The events of every tool and model span of ``message``; a span that cannot be read, whose
    events the store could not hold, or that names a program outside ``scope`` is refused alone."""
    out = Received()
    for where, span in _spans(message):
        out.spans += 1
        problem = _ids(span)
        if problem is not None:
            out.refuse(f"{where}.{problem}")
            continue
        events = span_events(_record(span))
        try:
            for e in events:
                check_event(e)
        except EventError as exc:
            out.refuse(f"{where}: {exc}")
            continue
        outside = next((name for name in map(scope.outside, events) if name is not None), None)
        if outside is not None:
            out.refuse(f"{where}: {outside}: {events[0].program_id[:64]!r} is not among this token's programs")
            continue
        out.events.extend(events)
    return out


# -- the route -----------------------------------------------------------------------------------


def _answer(proto: _Proto, message: Any, media: str, status: int = 200) -> Response:
    """``message`` in the encoding of the request (the OTLP/HTTP rule for answers)."""
    if media == PROTOBUF:
        return Response(message.SerializeToString(), status_code=status, media_type=PROTOBUF)
    return Response(orjson.dumps(proto.json_format.MessageToDict(message)), status_code=status, media_type=JSON)


class _Receiver:
    def __init__(self, runtime: LiveDriver, proto: _Proto | None, max_bytes: int) -> None:
        self.runtime, self.proto, self.max_bytes = runtime, proto, max_bytes

    async def traces(self, request: Request, scope: Scope) -> Response:
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media not in (PROTOBUF, JSON):  # the origin guard admits only these two here
            raise HTTPProblem(415, f"content-type: expected {JSON} or {PROTOBUF}, got {media[:100]!r}", field="content-type")
        if self.proto is None:
            raise HTTPProblem(501, MISSING, kind="not_implemented")
        proto = self.proto
        raw = await read_body(request, self.max_bytes)
        encoding = request.headers.get("content-encoding", "").strip().lower()

        def parse() -> Received:
            return receive(decode(proto, inflate(raw, encoding, self.max_bytes), media), scope)

        # A compressed body is parsed off the loop whatever its size on the wire: inflated, it may
        # be up to the limit.
        size = len(raw) if encoding in ("", "identity") else self.max_bytes
        try:
            received = await off_loop(parse, size)
        except Undecodable as exc:
            return _answer(proto, proto.status(code=INVALID_ARGUMENT, message=str(exc)), media, 400)
        if received.events:
            await ingest_in_slices(self.runtime, received.events)
        answer = proto.response()
        if received.rejected:
            answer.partial_success.rejected_spans = received.rejected
            answer.partial_success.error_message = (
                f"{received.rejected} of {received.spans} spans refused; first: {received.first_problem}"
            )
        return _answer(proto, answer, media)


def add_otlp_route(app: GatewayApp, runtime: LiveDriver, *, tokens: Tokens, max_bytes: int) -> None:
    """``POST /v1/traces`` (see the module docstring); 501 when ``opentelemetry-proto`` is missing."""
    proto = _load_proto()
    if proto is None:
        log.info("maitred: %s", MISSING)
    receiver = _Receiver(runtime, proto, max_bytes)
    app.post_ahead(PATH, guarded(tokens, receiver.traces))  # what an agent's exporter sends: ahead of FastAPI's stack
