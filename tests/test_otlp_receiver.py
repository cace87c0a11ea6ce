"""The gateway's OTLP/HTTP receiver, ``POST /v1/traces``: a real gateway on 127.0.0.1 (telemetry
only, persisting to a real store), fed by the OpenTelemetry SDK's real OTLP/HTTP exporter
(protobuf, plain and gzip) and by OTLP JSON bodies, its answers read as OTLP clients read them."""

import gzip
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.trace import Status as SpanStatus
from opentelemetry.trace import StatusCode

from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.trust import Tokens
from maitred.harness.background import BackgroundServer
from maitred.storage import SessionStore
from tests.helpers import wait_until

TOOL_SPAN = "5b8efff798038103"
TRACE = "5b8efff798038103d269b633813fc60c"


@pytest.fixture
def gateway(db_url: str) -> Iterator[Callable[..., str]]:
    """``gateway(**serve)``: a telemetry-only gateway on the test's store; returns its URL."""
    with ExitStack() as stack:

        def make(**serve: Any) -> str:
            app = build_app(ServeConfig([], db_url=db_url, **serve)).app
            return stack.enter_context(BackgroundServer(app)).url

        yield make


def stored(db_url: str, count: int) -> list[dict[str, Any]]:
    """The store's events once ``count`` of them are there (the gateway writes in the background)."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal found
        with SessionStore(db_url) as store:
            found = store.events()
        return len(found) >= count

    assert wait_until(enough, timeout=20), found
    return found


def ns(seconds: float) -> str:
    return str(int(seconds * 1e9))


def attribute(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    return {"key": key, "value": {"intValue": str(value)}}


def json_span(name: str, span_id: str, attributes: dict[str, Any], *, start: float, end: float, **extra: Any) -> dict[str, Any]:
    return {
        "traceId": TRACE,
        "spanId": span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": ns(start),
        "endTimeUnixNano": ns(end),
        "attributes": [attribute(k, v) for k, v in attributes.items()],
        **extra,
    }


def export(*spans: dict[str, Any]) -> dict[str, Any]:
    resource = {"attributes": [attribute("service.name", "agent")]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "hand"}, "spans": list(spans)}]}]}


class Exporting(SimpleSpanProcessor):
    """The SDK's simple processor, keeping what its exporter answered for each span."""

    def __init__(self, exporter: OTLPSpanExporter) -> None:
        super().__init__(exporter)
        self.results: list[SpanExportResult] = []

    def on_end(self, span: Any) -> None:
        self.results.append(self.span_exporter.export((span,)))


def test_the_sdks_otlp_exporter_delivers_an_agents_spans_as_events_plain_and_gzip(gateway, db_url):
    url = gateway()
    for compression, session in ((Compression.NoCompression, "sess-plain"), (Compression.Gzip, "sess-gzip")):
        exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", compression=compression)
        provider = TracerProvider()
        recording = Exporting(exporter)
        provider.add_span_processor(recording)
        tracer = provider.get_tracer("agent")
        with tracer.start_as_current_span("invoke_agent coder", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span(
                "chat qwen-7b", attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": session}
            ) as span:
                span.set_attribute("gen_ai.usage.input_tokens", 2100)
                span.set_attribute("gen_ai.usage.output_tokens", 96)
            with tracer.start_as_current_span(
                "execute_tool pytest",
                attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.conversation.id": session},
            ) as span:
                span.set_attribute("gen_ai.tool.call.id", f"call-{session}")
                span.set_status(SpanStatus(StatusCode.ERROR, "2 failed"))
        provider.shutdown()
        assert recording.results == [SpanExportResult.SUCCESS] * 3
    events = stored(db_url, 8)
    by_program = {s: [e for e in events if e["program_id"] == s] for s in ("sess-plain", "sess-gzip")}
    for session, mine in by_program.items():
        assert [e["type"] for e in mine] == ["llm.start", "llm.end", "tool.start", "tool.end"]
        llm_end, tool_start, tool_end = mine[1], mine[2], mine[3]
        assert (llm_end["prompt_tokens"], llm_end["completion_tokens"]) == (2100, 96)
        assert tool_start["tool"] == "pytest" and tool_start["call_id"] == tool_end["call_id"] == f"call-{session}"
        assert tool_end["status"] == "error" and tool_end["duration_s"] >= 0
    programs = httpx.get(f"{url}/v1/programs", timeout=10).json()
    assert {"sess-plain", "sess-gzip"} <= {p["program_id"] for p in programs}


def test_a_json_export_with_a_bad_span_is_a_partial_success_naming_it(gateway, db_url):
    url = gateway()
    now = time.time()
    body = export(
        json_span("plan", "1111111111111111", {"openinference.span.kind": "CHAIN"}, start=now - 2, end=now - 1),
        json_span("grep", "zz-not-hex", {"openinference.span.kind": "TOOL", "tool.name": "grep"}, start=now - 2, end=now - 1),
        json_span(
            "grep",
            TOOL_SPAN,
            {"openinference.span.kind": "TOOL", "tool.name": "grep", "session.id": "json-1"},
            start=now - 2,
            end=now - 1.5,
            status={"code": 2, "message": "boom"},
            events=[
                {"name": "exception", "timeUnixNano": ns(now - 1.5), "attributes": [attribute("exception.type", "TimeoutError")]}
            ],
        ),
        json_span(
            "read",
            "2222222222222222",
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "x" * 300},
            start=now - 2,
            end=now - 1,
        ),
    )
    response = httpx.post(f"{url}/v1/traces", json=body, timeout=10)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 2
    assert partial["errorMessage"].startswith("2 of 4 spans refused; first: resourceSpans[0].scopeSpans[0].spans[1].spanId:")
    start, end = stored(db_url, 2)
    assert (start["type"], start["program_id"], start["tool"], start["call_id"]) == ("tool.start", "json-1", "grep", TOOL_SPAN)
    assert (end["status"], end["duration_s"]) == ("timeout", pytest.approx(0.5, abs=1e-3))
    again = httpx.post(f"{url}/v1/traces", json=body, timeout=10)  # a collector retrying stores nothing twice
    assert again.status_code == 200
    assert len(stored(db_url, 2)) == 2


def test_a_body_that_is_no_otlp_export_gets_400_with_a_status_in_its_own_encoding(gateway):
    url = gateway()
    response = httpx.post(f"{url}/v1/traces", content=b"\xff\xff\xff", headers={"content-type": "application/x-protobuf"})
    assert response.status_code == 400 and response.headers["content-type"] == "application/x-protobuf"
    status = Status.FromString(response.content)
    assert status.code == 3 and status.message.startswith("body: not an OTLP ExportTraceServiceRequest in protobuf")
    response = httpx.post(f"{url}/v1/traces", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["message"].startswith("body: invalid JSON")
    response = httpx.post(f"{url}/v1/traces", json={"resourceSpans": "nope"})
    assert response.status_code == 400 and "resourceSpans" in response.json()["message"]
    bad_gzip = {"content-type": "application/json", "content-encoding": "gzip"}
    response = httpx.post(f"{url}/v1/traces", content=b"not gzip", headers=bad_gzip)
    assert response.status_code == 400 and response.json()["message"].startswith("body: not valid gzip")


def test_other_content_types_and_encodings_get_415_and_a_big_body_413(gateway):
    url = gateway(max_events_bytes=4096)
    response = httpx.post(f"{url}/v1/traces", content=b"resourceSpans", headers={"content-type": "text/plain"})
    assert response.status_code == 415 and response.json()["error"]["field"] == "content-type"
    response = httpx.post(f"{url}/v1/events", content=b"\x0a\x00", headers={"content-type": "application/x-protobuf"})
    assert response.status_code == 415  # protobuf is admitted on /v1/traces alone
    response = httpx.post(
        f"{url}/v1/traces", content=b"{}", headers={"content-type": "application/json", "content-encoding": "br"}
    )
    assert response.status_code == 415 and response.json()["error"]["field"] == "content-encoding"
    big = json.dumps(export(*[json_span("plan", f"{i + 1:016x}", {"k": "v" * 64}, start=1, end=2) for i in range(60)]))
    response = httpx.post(f"{url}/v1/traces", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413
    bomb = gzip.compress(b" " * 100_000)  # small on the wire, over the limit once inflated
    response = httpx.post(
        f"{url}/v1/traces", content=bomb, headers={"content-type": "application/json", "content-encoding": "gzip"}
    )
    assert response.status_code == 413 and "inflated" in response.json()["error"]["message"]


def test_tokens_and_scopes_apply_as_they_do_to_events(gateway, db_url):
    scoped, admin = secrets.token_hex(16), secrets.token_hex(16)
    url = gateway(tokens=Tokens.of(admin, [f"{scoped} team-a/"]))
    now = time.time()
    body = export(
        json_span("execute_tool ls", "3333333333333333", {"gen_ai.conversation.id": "team-a/p1"}, start=now - 1, end=now),
        json_span("execute_tool ls", "4444444444444444", {"gen_ai.conversation.id": "team-b/p2"}, start=now - 1, end=now),
    )
    assert httpx.post(f"{url}/v1/traces", json=body, timeout=10).status_code == 401
    response = httpx.post(f"{url}/v1/traces", json=body, headers={"authorization": f"Bearer {scoped}"}, timeout=10)
    partial = response.json()["partialSuccess"]
    assert int(partial["rejectedSpans"]) == 1
    assert "spans[1]: program_id: 'team-b/p2' is not among this token's programs" in partial["errorMessage"]
    assert {e["program_id"] for e in stored(db_url, 2)} == {"team-a/p1"}


def test_a_full_success_answers_an_empty_export_response(gateway):
    url = gateway()
    request_body = b""  # an ExportTraceServiceRequest with no spans encodes to nothing
    response = httpx.post(f"{url}/v1/traces", content=request_body, headers={"content-type": "application/x-protobuf"})
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert not answer.HasField("partial_success")


def test_without_opentelemetry_proto_the_route_answers_501_in_one_line(db_url, monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.proto.collector.trace.v1.trace_service_pb2", None)
    app = build_app(ServeConfig([], db_url=db_url)).app
    with BackgroundServer(app) as server:
        response = httpx.post(f"{server.url}/v1/traces", json=export(), timeout=10)
    assert response.status_code == 501
    message = response.json()["error"]["message"]
    assert "\n" not in message and "pip install 'maitred[otel]'" in message


def test_an_instrumented_langgraph_agent_exporting_to_the_gateway_gives_the_processors_events(gateway, db_url):
    """OpenInference around a real LangGraph agent, its spans batched by the SDK to the gateway:
    the events are those ``MaitredSpanProcessor`` gives in process (tests/test_otel_in.py)."""
    pytest.importorskip("openinference.instrumentation.langchain", reason="the dev extra is not installed")
    from langchain.agents import create_agent
    from openinference.instrumentation.langchain import LangChainInstrumentor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from tests.test_otel_in import add, grep, two_tools_then_done

    url = gateway()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        agent = create_agent(two_tools_then_done(), [add, grep], name="coder")
        agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "exported-1"}})
    finally:
        instrumentor.uninstrument()
    assert provider.force_flush(timeout_millis=20_000)
    provider.shutdown()
    events = stored(db_url, 8)
    assert {e["program_id"] for e in events} == {"exported-1"}
    assert sorted(e["tool"] for e in events if e["type"] == "tool.start") == ["add", "grep"]
    assert [(e["prompt_tokens"], e["completion_tokens"]) for e in events if e["type"] == "llm.end"] == [(120, 8), (150, 12)]
    assert len(events) == 8
