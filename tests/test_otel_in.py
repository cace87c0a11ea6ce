"""OpenTelemetry in: ``MaitredSpanProcessor`` on a real tracer provider, fed by the real
OpenInference and OpenLLMetry LangChain instrumentors around a real LangGraph agent (scripted
chat model), its events read back from a real store (SQLite, and PostgreSQL when configured).
And ``HttpSink`` sending the active ``traceparent``."""

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytest.importorskip("langchain", reason="the langgraph extra is not installed")
pytest.importorskip("openinference.instrumentation.langchain", reason="the dev extra is not installed")
pytest.importorskip("opentelemetry.instrumentation.langchain", reason="the dev extra is not installed")

from langchain.agents import create_agent
from langchain_core.tools import tool
from openinference.instrumentation import using_session
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.instrumentation.langchain import LangchainInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

import maitred
from maitred.events import ToolStart
from maitred.integrations import otel as otel_module
from maitred.integrations.otel import MaitredSpanProcessor
from maitred.middleware import EmitterSettings, HttpSink
from maitred.storage import SessionStore
from tests.helpers import EventServer, ListSink
from tests.integrations.scripted import ScriptedChatModel, add, answer, calls, grep

INSTRUMENTORS = {"openinference": LangChainInstrumentor, "openllmetry": LangchainInstrumentor}
FAST = EmitterSettings(interval_s=0.05)


def _unwrap_all(owner: type) -> None:
    for name, value in list(vars(owner).items()):
        while type(value).__name__ == "FunctionWrapper" and hasattr(value, "__wrapped__"):
            value = value.__wrapped__
            setattr(owner, name, value)


def uninstrument(instrumentor: Any) -> None:
    """``instrumentor.uninstrument()``, completed for OpenLLMetry: its 0.62 ``uninstrument``
    unwraps the agent factories but leaves these wrapped (its ``unwrap`` calls name the methods
    by a dotted path its helper does not follow), so its spans would keep coming in later tests."""
    instrumentor.uninstrument()
    if isinstance(instrumentor, LangchainInstrumentor):
        from langchain.agents.middleware.types import AgentMiddleware
        from langchain_core.callbacks import BaseCallbackManager
        from langchain_openai.chat_models.base import BaseChatOpenAI
        from langchain_openai.llms.base import BaseOpenAI
        from langgraph.pregel import Pregel
        from langgraph.types import Command

        for owner in (BaseCallbackManager, Pregel, Command, AgentMiddleware, BaseChatOpenAI, BaseOpenAI):
            _unwrap_all(owner)


@tool
def flaky(path: str) -> str:
    """Read a file that is not there."""
    raise FileNotFoundError(path)


@tool
def slow_build(target: str) -> str:
    """A build that runs out of time."""
    raise TimeoutError(target)


def two_tools_then_done() -> ScriptedChatModel:
    model = ScriptedChatModel(script=[calls(("add", "call_add"), ("grep", "call_grep")), answer("done")])
    model.script[0].tool_calls[0]["args"] = {"a": 2, "b": 3}
    model.script[0].tool_calls[1]["args"] = {"pattern": "total"}
    return model


@pytest.fixture
def provider(request: pytest.FixtureRequest) -> Iterator[tuple[TracerProvider, MaitredSpanProcessor]]:
    """A tracer provider with the processor, and the instrumentor named by the test's
    ``instrumentor`` parameter around LangChain, uninstrumented afterwards."""
    tracer_provider = TracerProvider()
    processor = MaitredSpanProcessor(**getattr(request, "param", {}))
    tracer_provider.add_span_processor(processor)
    yield tracer_provider, processor
    tracer_provider.shutdown()


@pytest.fixture(params=sorted(INSTRUMENTORS))
def instrumented(request: pytest.FixtureRequest, provider) -> Iterator[tuple[str, TracerProvider]]:
    tracer_provider, _ = provider
    instrumentor = INSTRUMENTORS[request.param]()
    instrumentor.instrument(tracer_provider=tracer_provider)
    yield request.param, tracer_provider
    uninstrument(instrumentor)


def stored(db_url: str) -> list[dict[str, Any]]:
    assert maitred.flush(timeout=10)
    with SessionStore(db_url) as store:
        return store.events()


def of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def test_tool_and_model_spans_of_a_langgraph_agent_become_paired_events_in_the_store(instrumented, db_url):
    name, _ = instrumented
    maitred.configure(db_url=db_url, settings=FAST)
    agent = create_agent(two_tools_then_done(), [add, grep], name="coder")
    result = agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": f"thread-{name}"}})
    assert result["messages"][-1].content == "done"
    events = stored(db_url)
    assert {e["program_id"] for e in events} == {f"thread-{name}"}  # the thread id the spans name, not the trace id
    starts, ends = of(events, "tool.start"), of(events, "tool.end")
    assert sorted(e["tool"] for e in starts) == ["add", "grep"]
    assert {e["call_id"] for e in starts} == {e["call_id"] for e in ends} and len(ends) == 2
    assert all(e["status"] == "ok" and e["duration_s"] >= 0 for e in ends)
    llm_starts, llm_ends = of(events, "llm.start"), of(events, "llm.end")
    assert len(llm_starts) == len(llm_ends) == 2  # the two model calls; the graph, node and chain spans are ignored
    assert {e["request_id"] for e in llm_starts} == {e["request_id"] for e in llm_ends}
    assert [(e["prompt_tokens"], e["completion_tokens"]) for e in llm_ends] == [(120, 8), (150, 12)]
    assert llm_ends[0]["cached_tokens"] == 60
    assert len({e["trace_id"] for e in llm_starts + llm_ends}) == 1  # one invocation, one trace
    assert len(events) == 8


def test_a_failing_tool_span_is_recorded_with_its_outcome_and_the_agent_sees_the_same_exception(instrumented, db_url):
    maitred.configure(db_url=db_url, settings=FAST)
    model = ScriptedChatModel(script=[calls(("flaky", "call_1"), args={"path": "/nope"}), answer("sorry")])
    agent = create_agent(model, [flaky], name="reader")
    with pytest.raises(FileNotFoundError, match="/nope"):
        agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "t-err"}})
    timeout_model = ScriptedChatModel(script=[calls(("slow_build", "call_2"), args={"target": "all"}), answer("late")])
    with pytest.raises(TimeoutError):
        create_agent(timeout_model, [slow_build], name="builder").invoke(
            {"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "t-timeout"}}
        )
    events = stored(db_url)
    ends = {e["program_id"]: e for e in of(events, "tool.end")}
    assert (ends["t-err"]["status"], ends["t-timeout"]["status"]) == ("error", "timeout")
    assert {e["tool"] for e in of(events, "tool.start")} == {"flaky", "slow_build"}


def test_a_program_id_in_the_run_metadata_names_the_program_as_for_maitreds_langgraph_adapters(instrumented, db_url):
    name, _ = instrumented
    maitred.configure(db_url=db_url, settings=FAST)
    agent = create_agent(two_tools_then_done(), [add, grep], name="coder")
    config = {"configurable": {"thread_id": "thread-x"}, "metadata": {"program_id": f"prog-{name}"}}
    agent.invoke({"messages": [{"role": "user", "content": "go"}]}, config)
    events = stored(db_url)
    assert len(events) == 8 and {e["program_id"] for e in events} == {f"prog-{name}"}


def test_an_explicitly_bound_program_wins_over_the_session_the_spans_name(instrumented, db_url):
    maitred.configure(db_url=db_url, settings=FAST)
    agent = create_agent(two_tools_then_done(), [add, grep], name="coder")
    with maitred.program("bound-42", agent="planner"):
        agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "thread-ignored"}})
    events = stored(db_url)
    calls_ = [e for e in events if e["type"].startswith(("tool.", "llm."))]
    assert len(calls_) == 8
    assert {(e["program_id"], e.get("agent")) for e in calls_} == {("bound-42", "planner")}


def test_openllmetry_tool_calls_are_recorded_live_while_the_tool_runs(provider, db_url):
    """OpenLLMetry names a tool span at its start (``execute_tool add``), so ``tool.start`` is in
    the store before the tool returns; OpenInference's LangChain spans are named at their end only."""
    tracer_provider, _ = provider
    maitred.configure(db_url=db_url, settings=FAST)
    seen_while_running: list[list[str]] = []

    @tool
    def pytest_run(path: str) -> str:
        """Run the tests."""
        seen_while_running.append([e["tool"] for e in of(stored(db_url), "tool.start")])
        return "12 passed"

    instrumentor = LangchainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        model = ScriptedChatModel(script=[calls(("pytest_run", "call_1"), args={"path": "tests"}), answer("ok")])
        create_agent(model, [pytest_run], name="tester").invoke(
            {"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "t-live"}}
        )
    finally:
        uninstrument(instrumentor)
    assert seen_while_running == [["pytest_run"]]
    [end] = of(stored(db_url), "tool.end")
    assert end["program_id"] == "t-live" and end["status"] == "ok"


def test_spans_that_are_no_tool_or_model_call_and_an_uninstrumented_agent_give_nothing(provider, tmp_path):
    tracer_provider, _ = provider
    db_url = f"sqlite:///{tmp_path / 'quiet.db'}"
    maitred.configure(db_url=db_url, settings=FAST)
    tracer = tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("load config", attributes={"config.path": "app.toml"}):
        with tracer.start_as_current_span("plan", attributes={"openinference.span.kind": "CHAIN"}):
            pass
        with tracer.start_as_current_span("execute_task model", attributes={"gen_ai.operation.name": "execute_task"}):
            pass
    for name in sorted(INSTRUMENTORS):  # instrumented, then uninstrumented: the agent's spans are gone
        instrumentor = INSTRUMENTORS[name]()
        instrumentor.instrument(tracer_provider=tracer_provider)
        uninstrument(instrumentor)
    create_agent(two_tools_then_done(), [add, grep], name="coder").invoke(
        {"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "t-plain"}}
    )
    assert stored(db_url) == []


def test_a_genai_span_without_a_session_is_recorded_under_its_trace_id(provider):
    tracer_provider, _ = provider
    sink = ListSink()
    maitred.configure(sinks=[sink], settings=FAST)
    tracer = tracer_provider.get_tracer("hand-instrumented")
    with tracer.start_as_current_span(
        "execute_tool bash", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "toolu_01"}
    ) as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        span.set_status(Status(StatusCode.ERROR, "exit 1"))
    with tracer.start_as_current_span(
        "chat qwen-7b", attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv-9"}
    ) as span:
        span.set_attribute("gen_ai.usage.input_tokens", 2100)
        span.set_attribute("gen_ai.usage.output_tokens", 96)
    with using_session("session-from-context"):  # OpenInference's context, read at the span's start
        with tracer.start_as_current_span("execute_tool ls"):
            pass
    assert maitred.flush(timeout=5)
    start, end, llm_start, llm_end, ls_start, ls_end = sink.events
    assert (ls_start.tool, ls_start.program_id, ls_end.program_id) == ("ls", "session-from-context", "session-from-context")
    assert (start.TYPE, start.program_id, start.call_id, start.tool) == ("tool.start", trace_id, "toolu_01", "bash")
    assert (end.TYPE, end.call_id, end.status) == ("tool.end", "toolu_01", "error")
    assert (llm_start.program_id, llm_start.model, llm_end.prompt_tokens, llm_end.completion_tokens) == (
        "conv-9",
        "qwen-7b",
        2100,
        96,
    )


@pytest.mark.parametrize("provider", [{"record_model_calls": False}], indirect=True)
def test_model_calls_can_be_left_to_the_gateway(provider):
    tracer_provider, _ = provider
    sink = ListSink()
    maitred.configure(sinks=[sink], settings=FAST)
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        create_agent(two_tools_then_done(), [add, grep], name="coder").invoke(
            {"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "t-tools"}}
        )
    finally:
        uninstrument(instrumentor)
    assert maitred.flush(timeout=5)
    assert sorted(e.TYPE for e in sink.events) == ["tool.end", "tool.end", "tool.start", "tool.start"]


def test_telemetry_failures_never_reach_the_instrumented_agent(provider, monkeypatch):
    tracer_provider, _ = provider

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("emitter exploded")

    monkeypatch.setattr(otel_module, "emit", broken)
    results = []
    for name in sorted(INSTRUMENTORS):
        instrumentor = INSTRUMENTORS[name]()
        instrumentor.instrument(tracer_provider=tracer_provider)
        try:
            agent = create_agent(two_tools_then_done(), [add, grep], name="coder")
            result = agent.invoke({"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "t"}})
            results.append(result["messages"][-1].content)
        finally:
            uninstrument(instrumentor)
    assert results == ["done", "done"]


def test_an_async_agent_records_its_tool_calls_too(instrumented):
    sink = ListSink()
    maitred.configure(sinks=[sink], settings=FAST)

    @tool
    async def fetch(url: str) -> str:
        """Fetch a page."""
        await asyncio.sleep(0)
        return f"<html>{url}</html>"

    model = ScriptedChatModel(script=[calls(("fetch", "call_fetch"), args={"url": "http://x"}), answer("ok")])
    agent = create_agent(model, [fetch], name="reader")
    result = asyncio.run(
        agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}, {"configurable": {"thread_id": "t-async"}})
    )
    assert result["messages"][-1].content == "ok"
    assert maitred.flush(timeout=5)
    [start] = [e for e in sink.events if isinstance(e, ToolStart)]
    assert (start.tool, start.program_id) == ("fetch", "t-async")


def test_http_sink_sends_the_active_traceparent_and_none_without_a_span():
    tracer = TracerProvider().get_tracer("agent")
    with EventServer() as server:
        sink = HttpSink(server.url)
        event = ToolStart(ts=time.time(), program_id="p", call_id="c1", tool="grep")
        sink.send([event])
        with tracer.start_as_current_span("agent step") as span:
            context = span.get_span_context()
            sink.send([event])
        sink.close()
    outside, inside = server.headers
    assert "traceparent" not in outside
    assert inside["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
