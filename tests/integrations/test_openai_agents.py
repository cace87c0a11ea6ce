"""OpenAI Agents SDK: a real Runner run on a scripted Model, traced by the maitred processor."""

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed")

from agents import Agent, Model, ModelResponse, RunConfig, Runner, function_tool, set_trace_processors
from agents.tracing import generation_span, response_span
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

import maitred
from maitred.integrations.openai_agents import MaitredRunHooks, MaitredTracingProcessor
from maitred.middleware import EmitterSettings
from tests.helpers import ListSink


def tool_call(name: str, call_id: str, arguments: str = "{}") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        arguments=arguments, call_id=call_id, name=name, type="function_call", id=f"fc_{call_id}", status="completed"
    )


def text(reply: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg_1",
        role="assistant",
        status="completed",
        type="message",
        content=[ResponseOutputText(text=reply, type="output_text", annotations=[])],
    )


class ScriptedModel(Model):
    """Answers from a script and opens the span the real models open: a generation span (Chat
    Completions) or, with ``responses=True``, a response span (the Responses API)."""

    def __init__(self, script: list[list[Any]], *, responses: bool = False, name: str = "scripted") -> None:
        self.script = iter(script)
        self.responses = responses
        self.name = name

    async def get_response(
        self,
        system_instructions,
        input,
        model_settings,
        tools,
        output_schema,
        handoffs,
        tracing,
        *,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
    ) -> ModelResponse:
        output = next(self.script)
        usage = Usage(
            requests=1,
            input_tokens=200,
            output_tokens=10,
            total_tokens=210,
            input_tokens_details=InputTokensDetails(cached_tokens=128, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        )
        if self.responses:
            with response_span() as span:
                span.span_data.response = Response.model_construct(
                    id="resp_1",
                    model=self.name,
                    output=output,
                    usage=ResponseUsage(
                        input_tokens=200,
                        output_tokens=10,
                        total_tokens=210,
                        input_tokens_details=InputTokensDetails(cached_tokens=128, cache_write_tokens=0),
                        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
                    ),
                )
        else:
            with generation_span(model=self.name) as span:
                span.span_data.usage = {"input_tokens": 200, "output_tokens": 10, "input_tokens_details": {"cached_tokens": 128}}
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run without streaming")


@function_tool
def lookup_order(order_id: str) -> str:
    """Find an order."""
    return f"order {order_id}: shipped"


@pytest.fixture
def sink() -> Iterator[ListSink]:
    sink = ListSink()
    maitred.configure(sinks=[sink], settings=EmitterSettings(interval_s=0.05))
    yield sink
    set_trace_processors([])


def run(agent: Agent, processor: MaitredTracingProcessor, hooks: Any = None, group: str | None = "conv-9") -> Any:
    set_trace_processors([processor])
    return asyncio.run(Runner.run(agent, "where is my order 17?", hooks=hooks, run_config=RunConfig(group_id=group)))


def agents_pair(responses: bool = False) -> Agent:
    billing = Agent(
        name="billing",
        instructions="billing",
        tools=[lookup_order],
        model=ScriptedModel(
            [
                [tool_call("lookup_order", "call_lookup_1", '{"order_id": "17"}')],
                [text("It shipped.")],
            ],
            responses=responses,
        ),
    )
    return Agent(
        name="triage",
        instructions="route",
        handoffs=[billing],
        model=ScriptedModel(
            [
                [tool_call("transfer_to_billing", "call_handoff_1")],
            ],
            responses=responses,
        ),
    )


def test_runner_records_tools_with_their_call_ids_handoffs_and_model_calls(sink):
    processor = MaitredTracingProcessor()
    result = run(agents_pair(), processor, hooks=MaitredRunHooks(processor))
    assert result.final_output == "It shipped."
    assert maitred.flush(timeout=5)
    [start] = sink.of_type("tool.start")
    [end] = sink.of_type("tool.end")
    assert (start.call_id, start.tool, start.agent, start.program_id) == ("call_lookup_1", "lookup_order", "billing", "conv-9")
    assert (end.call_id, end.status) == ("call_lookup_1", "ok") and end.duration_s >= 0
    [handoff] = sink.of_type("handoff")
    assert (handoff.program_id, handoff.from_agent, handoff.to_agent) == ("conv-9", "triage", "billing")
    ends = sink.of_type("llm.end")
    assert len(sink.of_type("llm.start")) == len(ends) == 3
    assert {(e.prompt_tokens, e.completion_tokens, e.cached_tokens) for e in ends} == {(200, 10, 128)}
    assert [e.agent for e in ends] == ["triage", "billing", "billing"]
    assert {e.program_id for e in sink.events} == {"conv-9"}


def test_response_spans_of_the_responses_model_are_model_calls(sink):
    processor = MaitredTracingProcessor()
    run(agents_pair(responses=True), processor, hooks=MaitredRunHooks(processor))
    assert maitred.flush(timeout=5)
    ends = sink.of_type("llm.end")
    assert len(ends) == 3 and {(e.prompt_tokens, e.cached_tokens) for e in ends} == {(200, 128)}


def test_without_hooks_a_tool_is_keyed_by_its_span_and_an_ungrouped_trace_is_its_own_program(sink):
    processor = MaitredTracingProcessor()
    run(agents_pair(), processor, group=None)
    assert maitred.flush(timeout=5)
    [start] = sink.of_type("tool.start")
    [end] = sink.of_type("tool.end")
    assert start.call_id == end.call_id and start.call_id.startswith("span_")
    assert start.program_id.startswith("trace_") and {e.program_id for e in sink.events} == {start.program_id}


def test_processor_with_hooks_still_records_a_run_that_passed_none(sink):
    processor = MaitredTracingProcessor()
    MaitredRunHooks(processor)
    run(agents_pair(), processor)
    assert maitred.flush(timeout=5)
    [start] = sink.of_type("tool.start")
    assert [e.call_id for e in sink.of_type("tool.end")] == [start.call_id]


def test_model_calls_can_be_left_to_the_gateway(sink):
    processor = MaitredTracingProcessor(record_model_calls=False)
    run(agents_pair(), processor, hooks=MaitredRunHooks(processor))
    assert maitred.flush(timeout=5)
    assert sink.of_type("llm.start") == sink.of_type("llm.end") == []
    assert [e.call_id for e in sink.of_type("tool.start")] == ["call_lookup_1"] and len(sink.of_type("handoff")) == 1


# -- runs: one trace is one run of the program ---------------------------------------------------


def test_a_finished_run_ends_its_program_in_the_store_with_framework_and_the_last_agent(db_url):
    from maitred.storage import SessionStore

    maitred.configure(db_url=db_url)
    processor = MaitredTracingProcessor()
    try:
        assert run(agents_pair(), processor, hooks=MaitredRunHooks(processor), group="conv-end").final_output == "It shipped."
    finally:
        set_trace_processors([])
    assert maitred.flush(timeout=10)
    with SessionStore(db_url) as store:
        [row] = [p for p in store.programs() if p.program_id == "conv-end"]
    assert (row.framework, row.agent, row.status) == ("openai-agents", "billing", "ok")
    assert row.ended_at is not None and (row.tool_calls, row.llm_calls) == (1, 3)


def test_a_run_that_raises_ends_with_error_and_the_caller_gets_the_same_exception(sink):
    failure = ConnectionResetError("model server went away")

    class Broken(ScriptedModel):
        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            raise failure

    agent = Agent(name="triage", instructions="route", model=Broken([]))
    with pytest.raises(ConnectionResetError) as raised:
        run(agent, MaitredTracingProcessor(), group="conv-crash")
    assert raised.value is failure
    assert maitred.flush(timeout=5)
    [start] = sink.of_type("program.start")
    [end] = sink.of_type("program.end")
    assert (start.program_id, start.framework, start.attrs) == ("conv-crash", "openai-agents", {"workflow": "Agent workflow"})
    assert (end.program_id, end.status, end.agent) == ("conv-crash", "error", "triage")
