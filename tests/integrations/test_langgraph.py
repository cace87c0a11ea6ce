"""LangGraph / LangChain: real graphs (create_agent, langgraph-swarm, langgraph-supervisor) driven
by a scripted chat model, recorded through the real emitter into a list sink."""

import asyncio
import warnings

import pytest

pytest.importorskip("langchain", reason="the langgraph extra is not installed")
pytest.importorskip("langgraph_swarm", reason="the langgraph extra is not installed")
pytest.importorskip("langgraph_supervisor", reason="the langgraph extra is not installed")

from typing import Annotated

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, Send
from langgraph_swarm import create_handoff_tool, create_swarm

import maitred
from maitred.events import ProgramStart
from maitred.integrations import langgraph as mlg
from maitred.integrations.langgraph import MaitredCallbackHandler, MaitredMiddleware, handoff_targets
from maitred.middleware import EmitterSettings
from maitred.middleware.config import emit
from tests.helpers import ListSink
from tests.integrations.scripted import ScriptedChatModel, add, answer, calls, grep


@pytest.fixture
def sink():
    sink = ListSink()
    maitred.configure(sinks=[sink], settings=EmitterSettings(interval_s=0.05))
    return sink


def flushed(sink: ListSink) -> ListSink:
    assert maitred.flush(timeout=5)
    return sink


@tool
async def fetch(url: str) -> str:
    """Fetch a page."""
    await asyncio.sleep(0)
    return f"<html>{url}</html>"


@tool
def flaky(path: str) -> str:
    """Read a file that is not there."""
    raise FileNotFoundError(path)


def config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def test_create_agent_records_tool_calls_with_the_models_ids_and_tags_each_model_request(sink):
    model = ScriptedChatModel(
        script=[
            calls(("add", "call_add_1"), ("grep", "call_grep_1"), args={}),
            answer("done"),
        ]
    )
    model.script[0].tool_calls[0]["args"] = {"a": 2, "b": 3}
    model.script[0].tool_calls[1]["args"] = {"pattern": "total"}
    agent = create_agent(model, [add, grep], name="coder", middleware=[MaitredMiddleware()])
    result = agent.invoke({"messages": [{"role": "user", "content": "go"}]}, config("thread-7"))
    assert result["messages"][-1].content == "done"
    events = flushed(sink).events
    starts = {e.call_id: e for e in sink.of_type("tool.start")}
    ends = {e.call_id: e for e in sink.of_type("tool.end")}
    assert set(starts) == set(ends) == {"call_add_1", "call_grep_1"}
    assert {(e.tool, e.agent, e.program_id) for e in starts.values()} == {
        ("add", "coder", "thread-7"),
        ("grep", "coder", "thread-7"),
    }
    assert all(e.status == "ok" and e.duration_s >= 0 for e in ends.values())
    llm_starts, llm_ends = sink.of_type("llm.start"), sink.of_type("llm.end")
    assert len(llm_starts) == len(llm_ends) == 2
    assert [(e.prompt_tokens, e.completion_tokens) for e in llm_ends] == [(120, 8), (150, 12)]
    assert llm_ends[0].cached_tokens == 60 and {e.agent for e in llm_ends} == {"coder"}
    assert all(e.program_id == "thread-7" for e in events)
    assert [kw["extra_body"]["program_id"] for kw in model.seen_kwargs] == ["thread-7", "thread-7"]
    assert [kw["extra_headers"]["x-program-id"] for kw in model.seen_kwargs] == ["thread-7", "thread-7"]


def test_async_agent_uses_the_async_hooks(sink):
    model = ScriptedChatModel(script=[calls(("fetch", "call_fetch_1"), args={"url": "http://x"}), answer("ok")])
    agent = create_agent(model, [fetch], name="reader", middleware=[MaitredMiddleware()])
    result = asyncio.run(
        agent.ainvoke(
            {"messages": [{"role": "user", "content": "go"}]},
            {"configurable": {"thread_id": "t-async"}, "metadata": {"program_id": "prog-async"}},
        )
    )
    assert result["messages"][-1].content == "ok"
    [start] = flushed(sink).of_type("tool.start")
    assert (start.call_id, start.tool, start.agent, start.program_id) == ("call_fetch_1", "fetch", "reader", "prog-async")
    assert [e.status for e in sink.of_type("tool.end")] == ["ok"]
    assert model.seen_kwargs[0]["extra_body"] == {"program_id": "prog-async"}


def test_a_failing_tool_is_recorded_as_an_error_and_the_agent_sees_the_same_outcome(sink):
    model = ScriptedChatModel(script=[calls(("flaky", "call_flaky_1"), args={"path": "/nope"}), answer("sorry")])
    plain = create_agent(ScriptedChatModel(script=list(model.script)), [flaky], name="reader")
    instrumented = create_agent(model, [flaky], name="reader", middleware=[MaitredMiddleware()])
    outcomes = []
    for agent in (plain, instrumented):
        try:
            result = agent.invoke({"messages": [{"role": "user", "content": "go"}]}, config("t-err"))
            outcomes.append(("result", [type(m).__name__ for m in result["messages"]]))
        except FileNotFoundError as exc:
            outcomes.append(("raised", str(exc)))
    assert outcomes[0] == outcomes[1]
    [end] = flushed(sink).of_type("tool.end")
    assert (end.call_id, end.status) == ("call_flaky_1", "error")


def test_telemetry_failures_never_reach_the_agent(sink, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("emitter exploded")

    monkeypatch.setattr(mlg, "emit", broken)
    model = ScriptedChatModel(script=[calls(("add", "call_add_9"), args={"a": 1, "b": 1}), answer("2")])
    agent = create_agent(model, [add], name="coder", middleware=[MaitredMiddleware()])
    result = agent.invoke({"messages": [{"role": "user", "content": "1+1"}]}, config("t-broken"))
    assert result["messages"][-1].content == "2"
    assert [m.content for m in result["messages"] if isinstance(m, ToolMessage)] == ["2"]


def swarm(middleware: bool) -> tuple:
    extra = {"middleware": [MaitredMiddleware()]} if middleware else {}
    alice_model = ScriptedChatModel(
        script=[
            calls(("add", "call_alice_add"), args={"a": 1, "b": 2}),
            calls(("transfer_to_bob", "call_to_bob")),
        ]
    )
    bob_model = ScriptedChatModel(script=[calls(("grep", "call_bob_grep"), args={"pattern": "x"}), answer("bob is done")])
    alice = create_agent(alice_model, [add, create_handoff_tool(agent_name="bob")], name="alice", **extra)
    bob = create_agent(bob_model, [grep], name="bob", **extra)
    app = create_swarm([alice, bob], default_active_agent="alice").compile(checkpointer=InMemorySaver())
    return app, alice_model, bob_model


def test_swarm_handoff_is_recorded_with_the_shared_messages(sink):
    app, _, bob_model = swarm(middleware=True)
    result = app.invoke({"messages": [{"role": "user", "content": "add then search"}]}, config("swarm-1"))
    assert result["messages"][-1].content == "bob is done"
    [handoff] = flushed(sink).of_type("handoff")
    assert (handoff.program_id, handoff.from_agent, handoff.to_agent) == ("swarm-1", "alice", "bob")
    roles = [m["role"] for m in handoff.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]
    assert handoff.messages[0]["content"] == "add then search"
    assert handoff.messages[-1]["tool_call_id"] == "call_to_bob" and handoff.context_hash
    by_call = {e.call_id: e.agent for e in sink.of_type("tool.start")}
    assert by_call == {"call_alice_add": "alice", "call_to_bob": "alice", "call_bob_grep": "bob"}
    assert bob_model.seen_kwargs[0]["extra_body"] == {"program_id": "swarm-1"}


def test_parallel_handoffs_with_send_are_one_event_each(sink):
    @tool
    def fan_out(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Ask bob and carol at once."""
        note = ToolMessage("sent", tool_call_id=tool_call_id)
        return Command(
            graph=Command.PARENT,
            goto=[
                Send("bob", {"messages": [HumanMessage("bob: check the tests"), note]}),
                Send("carol", {"messages": [HumanMessage("carol: check the docs")]}),
            ],
        )

    lead = create_agent(
        ScriptedChatModel(script=[calls(("fan_out", "call_fan"))]), [fan_out], name="lead", middleware=[MaitredMiddleware()]
    )
    seen: dict[str, str] = {}

    def worker(name: str):
        def run(state: MessagesState) -> dict:
            seen[name] = state["messages"][0].content
            return {}

        return run

    graph = StateGraph(MessagesState)
    graph.add_node("lead", lead, destinations=("bob", "carol"))
    graph.add_node("bob", worker("bob"))
    graph.add_node("carol", worker("carol"))
    graph.add_edge(START, "lead")
    graph.compile().invoke({"messages": [{"role": "user", "content": "review"}]}, config("fan-1"))
    assert seen == {"bob": "bob: check the tests", "carol": "carol: check the docs"}
    handoffs = {h.to_agent: h for h in flushed(sink).of_type("handoff")}
    assert set(handoffs) == {"bob", "carol"}
    assert all(h.from_agent == "lead" and h.program_id == "fan-1" for h in handoffs.values())
    assert [m["content"] for m in handoffs["bob"].messages] == ["bob: check the tests", "sent"]
    assert [m["content"] for m in handoffs["carol"].messages] == ["carol: check the docs"]


def test_handoff_targets_ignore_commands_for_the_own_graph():
    assert handoff_targets(Command(goto="b", update={"messages": []})) == []
    assert handoff_targets(ToolMessage("x", tool_call_id="c")) == []
    assert handoff_targets(Command(graph=Command.PARENT, goto="b")) == [("b", None)]


def test_callback_handler_records_a_swarm_without_middleware_and_no_double_handoff(sink):
    app, _, _ = swarm(middleware=False)
    app.invoke({"messages": [{"role": "user", "content": "go"}]}, {**config("swarm-cb"), "callbacks": [MaitredCallbackHandler()]})
    flushed(sink)
    assert {e.call_id for e in sink.of_type("tool.start")} == {"call_alice_add", "call_to_bob", "call_bob_grep"}
    assert [(h.from_agent, h.to_agent) for h in sink.of_type("handoff")] == [("alice", "bob")]
    assert len(sink.of_type("llm.start")) == len(sink.of_type("llm.end")) == 4  # alice twice, bob twice


def test_supervisor_handoffs_and_the_hand_back_reach_the_callback_handler(sink):
    from langgraph_supervisor import create_supervisor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

        math_model = ScriptedChatModel(script=[calls(("add", "call_math_add"), args={"a": 20, "b": 22}), answer("42")])
        math_agent = create_react_agent(math_model, [add], name="math_expert")
        supervisor_model = ScriptedChatModel(
            script=[calls(("transfer_to_math_expert", "call_to_math")), answer("the answer is 42")]
        )
        app = create_supervisor([math_agent], model=supervisor_model, supervisor_name="supervisor").compile()
    result = app.invoke(
        {"messages": [{"role": "user", "content": "what is 20+22?"}]},
        {**config("sup-1"), "callbacks": [MaitredCallbackHandler()]},
    )
    assert result["messages"][-1].content == "the answer is 42"
    flushed(sink)
    handoffs = sink.of_type("handoff")
    assert [(h.from_agent, h.to_agent) for h in handoffs] == [("supervisor", "math_expert"), ("math_expert", "supervisor")]
    there, back = handoffs
    assert there.messages[0]["content"] == "what is 20+22?" and there.messages[-1]["tool_call_id"] == "call_to_math"
    assert back.messages[-1]["content"].startswith("Successfully transferred back to supervisor")
    tools = {e.call_id: (e.tool, e.agent) for e in sink.of_type("tool.start")}
    assert tools == {"call_to_math": ("transfer_to_math_expert", "supervisor"), "call_math_add": ("add", "math_expert")}
    assert {e.program_id for e in sink.events} == {"sup-1"}


def test_tagging_can_be_turned_off_for_clients_that_refuse_extra_keywords(sink):
    model = ScriptedChatModel(script=[calls(("add", "call_add_t"), args={"a": 1, "b": 2}), answer("3")])
    agent = create_agent(model, [add], name="coder", middleware=[MaitredMiddleware(tag_requests=False)])
    agent.invoke({"messages": [{"role": "user", "content": "1+2"}]}, config("t-untagged"))
    assert model.seen_kwargs == [{}, {}]
    assert [e.call_id for e in flushed(sink).of_type("tool.start")] == ["call_add_t"]
    assert len(sink.of_type("llm.end")) == 2


def test_model_name_is_read_from_the_model_or_the_model_it_binds() -> None:
    from langchain_core.language_models import GenericFakeChatModel
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="qwen-7b", api_key="unused", base_url="http://127.0.0.1:9/v1")
    assert mlg._model_name(model) == "qwen-7b"
    assert mlg._model_name(model.bind(stop=["\n"])) == "qwen-7b"
    assert mlg._model_name(GenericFakeChatModel(messages=iter([]))) is None


def test_a_model_request_stays_tagged_when_its_events_cannot_be_recorded(sink, monkeypatch):
    """The gateway schedules by the tag, so a failing emitter must not take it off the request."""

    def broken(*args, **kwargs):
        raise RuntimeError("emitter exploded")

    monkeypatch.setattr(mlg, "emit", broken)
    model = ScriptedChatModel(script=[calls(("add", "call_add_b"), args={"a": 1, "b": 1}), answer("2")])
    agent = create_agent(model, [add], name="coder", middleware=[MaitredMiddleware()])
    agent.invoke({"messages": [{"role": "user", "content": "1+1"}]}, config("t-tag-kept"))
    assert [kw["extra_body"] for kw in model.seen_kwargs] == [{"program_id": "t-tag-kept"}] * 2
    assert [kw["extra_headers"] for kw in model.seen_kwargs] == [{"x-program-id": "t-tag-kept"}] * 2


def test_the_tagged_request_is_what_override_makes_and_the_original_is_untouched():
    """``_with_settings`` stands in for ``ModelRequest.override`` on the hot path: same request."""
    from langchain.agents.middleware import ModelRequest
    from langchain_core.messages import SystemMessage

    request = ModelRequest(
        model=ScriptedChatModel(script=[answer("x")]),
        messages=[HumanMessage("hi")],
        system_message=SystemMessage("be brief"),
        tool_choice="auto",
        tools=[add],
        state={"messages": []},
        model_settings={"extra_body": {"top_k": 5}, "temperature": 0},
    )
    tagged = mlg._tagged(request, "p-1")
    expected = request.override(
        model_settings={
            "extra_body": {"top_k": 5, "program_id": "p-1"},
            "temperature": 0,
            "extra_headers": {"x-program-id": "p-1"},
        }
    )
    assert type(tagged) is type(expected) and tagged == expected and vars(tagged) == vars(expected)
    assert request.model_settings == {"extra_body": {"top_k": 5}, "temperature": 0}


def test_the_model_name_follows_a_model_chosen_per_call(sink):
    """The name is remembered per model object; an outer middleware switching models must show."""
    from langchain.agents.middleware import AgentMiddleware

    small = ScriptedChatModel(script=[calls(("add", "call_add_s"), args={"a": 1, "b": 1})], model_name="small")
    large = ScriptedChatModel(script=[answer("2")], model_name="large")

    class Escalate(AgentMiddleware):
        def wrap_model_call(self, request, handler):
            return handler(request.override(model=large) if len(request.messages) > 1 else request)

    agent = create_agent(small, [add], name="coder", middleware=[Escalate(), MaitredMiddleware()])
    agent.invoke({"messages": [{"role": "user", "content": "1+1"}]}, config("t-models"))
    assert [e.model for e in flushed(sink).of_type("llm.start")] == ["small", "large"]


# -- runs: a finished or crashed run ends its program ---------------------------------------------


def program_row(db_url: str, program_id: str):
    from maitred.storage import SessionStore

    with SessionStore(db_url) as store:
        [row] = [p for p in store.programs() if p.program_id == program_id]
        return row


def test_a_finished_agent_run_ends_its_program_in_the_store_with_framework_and_agent(db_url):
    maitred.configure(db_url=db_url)
    model = ScriptedChatModel(script=[calls(("add", "call_add_r"), args={"a": 1, "b": 2}), answer("3")])
    agent = create_agent(model, [add], name="coder", middleware=[MaitredMiddleware()])
    agent.invoke({"messages": [{"role": "user", "content": "1+2"}]}, config("t-run"))
    assert maitred.flush(timeout=10)
    row = program_row(db_url, "t-run")
    assert (row.framework, row.agent, row.status) == ("langgraph", "coder", "ok")
    assert row.ended_at is not None and row.ended_at >= row.started_at
    assert (row.tool_calls, row.llm_calls) == (1, 2)


def test_a_thread_invoked_again_starts_its_program_again_and_ends_it_again(db_url):
    maitred.configure(db_url=db_url)
    model = ScriptedChatModel(script=[answer("hi"), answer("again")])
    agent = create_agent(model, [add], name="coder", middleware=[MaitredMiddleware()], checkpointer=InMemorySaver())
    agent.invoke({"messages": [{"role": "user", "content": "hello"}]}, config("t-twice"))
    assert maitred.flush(timeout=10)
    first = program_row(db_url, "t-twice")
    emit(ProgramStart(ts=first.ended_at + 1, program_id="t-twice", framework="langgraph"))
    assert maitred.flush(timeout=10)
    reopened = program_row(db_url, "t-twice")
    assert (reopened.status, reopened.ended_at) == (None, None)  # running again, not shown as ended
    agent.invoke({"messages": [{"role": "user", "content": "more"}]}, config("t-twice"))
    assert maitred.flush(timeout=10)
    second = program_row(db_url, "t-twice")
    assert second.status == "ok" and second.ended_at > first.ended_at


@pytest.mark.parametrize("failing", ["tool", "model"])
def test_a_run_whose_node_raises_ends_with_error_and_the_caller_gets_the_same_exception(sink, failing):
    class Broken(ScriptedChatModel):
        def _generate(self, *args, **kwargs):
            raise ConnectionResetError("model server went away")

    script = [calls(("flaky", "call_flaky_r"), args={"path": "/nope"}), answer("sorry")]
    model = Broken(script=script) if failing == "model" else ScriptedChatModel(script=script)
    expected = ConnectionResetError if failing == "model" else FileNotFoundError
    agent = create_agent(model, [flaky], name="reader", middleware=[MaitredMiddleware()])
    with pytest.raises(expected) as raised:
        agent.invoke({"messages": [{"role": "user", "content": "read"}]}, config(f"t-crash-{failing}"))
    assert raised.type is expected and str(raised.value) == ("model server went away" if failing == "model" else "/nope")
    flushed(sink)
    [start] = sink.of_type("program.start")
    [end] = sink.of_type("program.end")
    assert (start.program_id, start.framework, start.agent) == (f"t-crash-{failing}", "langgraph", "reader")
    assert (end.program_id, end.status, end.agent) == (f"t-crash-{failing}", "error", "reader")


def test_the_callback_handler_ends_a_swarm_run_naming_the_agent_that_ran_last(sink):
    app, _, _ = swarm(middleware=False)
    app.invoke(
        {"messages": [{"role": "user", "content": "go"}]}, {**config("swarm-run"), "callbacks": [MaitredCallbackHandler()]}
    )
    flushed(sink)
    [start] = sink.of_type("program.start")
    [end] = sink.of_type("program.end")
    assert (start.program_id, start.framework) == ("swarm-run", "langgraph")
    assert (end.program_id, end.status, end.agent) == ("swarm-run", "ok", "bob")


def test_a_graph_whose_node_raises_ends_with_error_through_callbacks_and_the_exception_is_unchanged(sink):
    failure = RuntimeError("node exploded")

    def explode(state: MessagesState) -> dict:
        raise failure

    graph = StateGraph(MessagesState)
    graph.add_node("explode", explode)
    graph.add_edge(START, "explode")
    app = graph.compile()
    with pytest.raises(RuntimeError) as raised:
        app.invoke(
            {"messages": [{"role": "user", "content": "go"}]}, {**config("g-crash"), "callbacks": [MaitredCallbackHandler()]}
        )
    assert raised.value is failure
    flushed(sink)
    assert [(e.program_id, e.framework) for e in sink.of_type("program.start")] == [("g-crash", "langgraph")]
    assert [(e.program_id, e.status) for e in sink.of_type("program.end")] == [("g-crash", "error")]


def test_runs_only_callbacks_beside_the_middleware_end_a_swarm_without_recording_calls_twice(sink):
    app, _, _ = swarm(middleware=True)
    app.invoke(
        {"messages": [{"role": "user", "content": "go"}]},
        {**config("swarm-both"), "callbacks": [MaitredCallbackHandler(record_calls=False)]},
    )
    flushed(sink)
    assert {e.call_id for e in sink.of_type("tool.start")} == {"call_alice_add", "call_to_bob", "call_bob_grep"}
    assert len(sink.of_type("tool.start")) == 3 and len(sink.of_type("handoff")) == 1
    assert [(e.status, e.agent) for e in sink.of_type("program.end")] == [("ok", "bob")]
