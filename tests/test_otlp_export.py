"""The OTLP export: events paired into GenAI spans (``SpanPairs``), and ``OtlpSink`` against a
real OTLP/HTTP receiver on 127.0.0.1 that decodes what it is sent with opentelemetry-proto.
Phoenix itself is in ``tests/integrations/test_phoenix.py``."""

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind, StatusCode

import maitred
from maitred.cli import main as maitred_main
from maitred.events import (
    Handoff,
    LLMEnd,
    LLMStart,
    ProgramEnd,
    ProgramStart,
    ProgramWait,
    ToolEnd,
    ToolProgress,
    ToolStart,
    dumps_batch,
)
from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.live_config import LiveConfig
from maitred.harness.background import BackgroundServer
from maitred.middleware.emitter import Emitter, EmitterSettings
from maitred.middleware.otlp import OtlpSink, traces_url
from maitred.middleware.otlp_spans import SpanPairs, span_context, trace_id
from maitred.middleware.span_notes import SpanNotes, span_key
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from tests.helpers import free_port, wait_until
from tests.otlp_receiver import OtlpReceiver

NOW = 1_760_000_000.0


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    yield running
    running.close()


def _pairs(max_open: int = 100) -> SpanPairs:
    return SpanPairs(Resource.create({"service.name": "maitred-test"}), max_open=max_open)


def _program(pid: str = "p-1", t: float = NOW) -> list[Any]:
    return [
        ProgramStart(ts=t, program_id=pid, agent="planner", framework="langgraph"),
        LLMStart(ts=t + 1, program_id=pid, agent="planner", request_id="r1", model="qwen", prompt_tokens=100),
        LLMEnd(
            ts=t + 2,
            program_id=pid,
            agent="planner",
            request_id="r1",
            prompt_tokens=120,
            completion_tokens=30,
            cached_tokens=64,
            worker="w0",
        ),
        ToolStart(ts=t + 3, program_id=pid, agent="planner", call_id="c1", tool="pytest", deadline_s=600.0),
        ToolProgress(ts=t + 4, program_id=pid, agent="planner", call_id="c1", fraction=0.5),
        ToolEnd(ts=t + 5, program_id=pid, agent="planner", call_id="c1", status="error", duration_s=2.0),
        Handoff(
            ts=t + 6, program_id=pid, agent="planner", from_agent="planner", to_agent="coder", child_program_id=f"{pid}/coder"
        ),
        ProgramEnd(ts=t + 7, program_id=pid, agent="planner"),
    ]


def test_a_program_becomes_one_trace_of_genai_spans_under_its_invoke_agent_span():
    spans = {f.span.name: f.span for f in _pairs().feed(_program())}
    assert set(spans) == {"invoke_agent planner", "chat qwen", "execute_tool pytest"}
    agent, chat, tool = spans["invoke_agent planner"], spans["chat qwen"], spans["execute_tool pytest"]
    assert {s.context.trace_id for s in spans.values()} == {trace_id("p-1")}
    assert agent.parent is None and chat.parent == agent.context and tool.parent == agent.context
    assert (chat.kind, tool.kind, agent.kind) == (SpanKind.CLIENT, SpanKind.INTERNAL, SpanKind.INTERNAL)
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.conversation.id"] == "p-1" and agent.attributes["gen_ai.agent.name"] == "planner"
    assert agent.attributes["maitred.framework"] == "langgraph"
    assert chat.attributes["gen_ai.operation.name"] == "chat" and chat.attributes["gen_ai.request.model"] == "qwen"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 120 and chat.attributes["gen_ai.usage.output_tokens"] == 30
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 64 and chat.attributes["maitred.worker"] == "w0"
    assert tool.attributes["gen_ai.tool.name"] == "pytest" and tool.attributes["gen_ai.tool.call.id"] == "c1"
    assert tool.attributes["maitred.deadline_s"] == 600.0 and tool.attributes["maitred.status"] == "error"
    assert tool.status.status_code is StatusCode.ERROR and chat.status.status_code is StatusCode.UNSET
    assert (tool.start_time, tool.end_time) == (int((NOW + 3) * 1e9), int((NOW + 5) * 1e9))
    assert [e.name for e in tool.events] == ["tool.progress"] and tool.events[0].attributes["maitred.fraction"] == 0.5
    assert [e.name for e in agent.events] == ["handoff"] and agent.events[0].attributes["maitred.to_agent"] == "coder"
    assert [link.context for link in agent.links] == [span_context("p-1/coder")]
    assert not any("maitred.incomplete" in s.attributes for s in spans.values())


def test_a_start_and_its_end_pair_across_batches_and_a_retried_start_counts_once():
    pairs, events = _pairs(), _program()
    assert pairs.feed(events[:2]) == [] and len(pairs) == 2
    assert pairs.feed(events[1:2]) == [] and len(pairs) == 2  # the same llm.start again
    (chat,) = pairs.feed(events[2:3])
    assert chat.span.name == "chat qwen" and chat.span.start_time == int((NOW + 1) * 1e9) and chat.events == 2


def test_a_subagent_links_to_its_parent_program_from_a_trace_of_its_own():
    child = ProgramStart(ts=NOW, program_id="child", parent_program_id="parent", agent="coder")
    (span,) = [f.span for f in _pairs().feed([child, ProgramEnd(ts=NOW + 1, program_id="child")])]
    assert span.context.trace_id == trace_id("child") != trace_id("parent")
    assert [link.context for link in span.links] == [span_context("parent")]


def test_spans_a_program_leaves_open_end_with_it_marked_incomplete():
    events = [
        ProgramStart(ts=NOW, program_id="p"),
        ToolStart(ts=NOW + 1, program_id="p", call_id="c", tool="sleep"),
        ProgramEnd(ts=NOW + 9, program_id="p", status="cancelled"),
    ]
    spans = {f.span.name: f.span for f in _pairs().feed(events)}
    tool = spans["execute_tool sleep"]
    assert tool.attributes["maitred.incomplete"] is True and tool.attributes["maitred.missing"] == "end"
    assert tool.end_time == int((NOW + 9) * 1e9)
    assert (
        spans["invoke_agent"].status.status_code is StatusCode.ERROR
        and "maitred.incomplete" not in spans["invoke_agent"].attributes
    )


def test_open_spans_are_bounded_the_oldest_ended_first_and_close_ends_the_rest():
    pairs = _pairs(max_open=2)
    starts = [ToolStart(ts=NOW + i, program_id="p", call_id=f"c{i}", tool=f"t{i}") for i in range(3)]
    (evicted,) = pairs.feed(starts)
    assert evicted.span.name == "execute_tool t0" and evicted.span.attributes["maitred.incomplete"] is True
    assert len(pairs) == 2
    rest = pairs.close(now=NOW + 10)
    assert sorted(f.span.name for f in rest) == ["execute_tool t1", "execute_tool t2"] and len(pairs) == 0
    assert all(f.span.attributes["maitred.missing"] == "end" and f.span.end_time == int((NOW + 10) * 1e9) for f in rest)


def test_an_end_whose_start_went_elsewhere_still_makes_a_span_in_the_same_trace_and_place():
    (tool,) = _pairs().feed([ToolEnd(ts=NOW + 5, program_id="p", call_id="c1", duration_s=2.0)])
    assert tool.span.context == span_context("p", "tool", "c1") and tool.span.parent == span_context("p")
    assert tool.span.start_time == int((NOW + 3) * 1e9) and tool.span.attributes["maitred.missing"] == "start"
    # what a second process (the gateway) makes of the same program's model call: same trace, same parent
    (chat,) = _pairs().feed(
        [
            LLMStart(ts=NOW, program_id="p", request_id="gw-1"),
            LLMEnd(ts=NOW + 1, program_id="p", request_id="gw-1", prompt_tokens=1, completion_tokens=1),
        ]
    )
    assert chat.span.parent == tool.span.parent and chat.span.context.trace_id == trace_id("p")


def test_an_event_about_a_program_this_sink_never_saw_start_is_a_point_span_under_it():
    (wait,) = _pairs().feed([ProgramWait(ts=NOW, program_id="p", reason="human")])
    assert wait.span.name == "program.wait" and wait.span.parent == span_context("p")
    assert wait.span.start_time == wait.span.end_time and wait.span.attributes["maitred.reason"] == "human"


def test_traces_url_takes_a_base_url_or_the_full_path_and_names_the_setting_it_refuses():
    assert traces_url("http://127.0.0.1:6006") == "http://127.0.0.1:6006/v1/traces"
    assert traces_url("https://cloud.example/api/public/otel/") == "https://cloud.example/api/public/otel/v1/traces"
    assert traces_url("http://h:4318/v1/traces") == "http://h:4318/v1/traces"
    with pytest.raises(ValueError, match="--otlp-endpoint: expected an http"):
        traces_url("127.0.0.1:4318", "--otlp-endpoint")
    with pytest.raises(ValueError, match="otlp_endpoint: expected an http"):
        maitred.configure(sinks=[], otlp_endpoint="ftp://h")


def test_configure_adds_the_otlp_export_beside_the_store(receiver, tmp_path):
    maitred.configure(db_url=f"sqlite:///{tmp_path / 'm.db'}", otlp_endpoint=receiver.url)
    with maitred.program("p-conf", agent="planner"):
        with maitred.tool_call("grep"):
            pass
    assert maitred.flush(10)
    assert [s.sink for s in maitred.stats()] == ["StoreSink", "OtlpSink"]
    tool, agent = receiver.named("execute_tool grep"), receiver.named("invoke_agent planner")
    assert tool["parent"] == agent["span_id"] and tool["trace_id"] == agent["trace_id"]
    assert tool["attributes"]["gen_ai.conversation.id"] == "p-conf"


def test_the_environment_variable_turns_the_export_on(receiver, tmp_path, monkeypatch):
    monkeypatch.setenv("MAITRED_OTLP_ENDPOINT", receiver.url)
    maitred.configure(db_url=f"sqlite:///{tmp_path / 'm.db'}")
    with maitred.program("p-env"):
        pass
    assert maitred.flush(10) and receiver.named("invoke_agent")["attributes"]["gen_ai.conversation.id"] == "p-env"


def test_a_receiver_that_is_down_costs_no_events_they_go_when_it_is_back_each_span_once(caplog):
    caplog.set_level(logging.INFO)
    port = free_port()
    emitter = Emitter(OtlpSink(f"http://127.0.0.1:{port}", timeout_s=0.5), EmitterSettings(interval_s=0.05, max_backoff_s=0.2))
    for event in _program("p-down"):
        emitter.emit(event)
    assert not emitter.flush(1.0)  # refused: nothing delivered yet, nothing dropped
    stats = emitter.stats()
    assert stats.queued == 8 and stats.dropped == 0 and "127.0.0.1" in (stats.last_error or "")
    receiver = OtlpReceiver(port)
    try:
        assert emitter.flush(20)
        assert sorted(s["name"] for s in receiver.spans) == ["chat qwen", "execute_tool pytest", "invoke_agent planner"]
        assert emitter.stats().delivered == 8 and emitter.stats().dropped == 0
        # one warning for the outage and one when it is over (said just after the batch went);
        # none from the exporter for each failed attempt
        back = "maitred: OtlpSink reachable again"
        assert wait_until(lambda: back in [r.getMessage() for r in caplog.records])
        assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
            "maitred: OtlpSink unavailable, buffering events and retrying",
            back,
        ]
    finally:
        assert emitter.shutdown(5)
        receiver.close()


def test_spans_the_receiver_refuses_for_their_content_count_their_events_as_refused():
    receiver = OtlpReceiver(status=400)
    sink = OtlpSink(receiver.url)
    start, llm_start, llm_end = _program("p-refused")[:3]
    try:
        assert sink.send([start, llm_start, llm_end]) == 2  # the chat span's two; program.start stays open
        assert sink.send([llm_start]) == 0 and receiver.requests == 1  # nothing ended: nothing sent
        assert sink.send([llm_end]) == 1  # its span holds two events, one of them in this batch
    finally:
        sink.close()
        receiver.close()


def test_close_exports_what_is_still_open_marked_incomplete(receiver):
    emitter = Emitter(OtlpSink(receiver.url))
    emitter.emit(ProgramStart(ts=NOW, program_id="p-open", agent="planner"))
    emitter.emit(ToolStart(ts=NOW + 1, program_id="p-open", call_id="c", tool="sleep"))
    assert emitter.flush(10) and receiver.spans == []
    assert emitter.shutdown(10)
    assert {s["name"]: s["attributes"]["maitred.incomplete"] for s in receiver.spans} == {
        "invoke_agent planner": True,
        "execute_tool sleep": True,
    }


@pytest.mark.parametrize("env, service", [({}, "maitred"), ({"OTEL_SERVICE_NAME": "triage-agent"}, "triage-agent")])
def test_the_service_name_is_maitred_unless_the_standard_variables_name_one(receiver, monkeypatch, env, service):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    emitter = Emitter(OtlpSink(receiver.url))
    emitter.emit(ToolEnd(ts=NOW, program_id="p-svc", call_id="c", duration_s=1.0))
    assert emitter.shutdown(10)
    assert [s["resource"]["service.name"] for s in receiver.spans] == [service]


def test_a_program_that_exits_without_flushing_still_exports_its_spans(receiver):
    """The first batch can be sent at interpreter exit (by shutdown), when the SDK's thread
    pools refuse work and new exit hooks cannot be registered."""
    code = (
        "import maitred\n"
        f"maitred.configure(sinks=[], otlp_endpoint={receiver.url!r})\n"
        "with maitred.program('p-exit', agent='a'):\n"
        "    with maitred.tool_call('t'):\n"
        "        pass\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert sorted(s["name"] for s in receiver.spans) == ["execute_tool t", "invoke_agent a"]


def test_a_missing_extra_is_one_line_naming_it():
    code = (
        "import sys; sys.modules['opentelemetry.exporter.otlp.proto.http'] = None\n"
        "import maitred\n"
        "try:\n    maitred.configure(sinks=[], otlp_endpoint='http://127.0.0.1:9')\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("pip install 'maitred[otel]'") and done.stdout.startswith("otlp_endpoint: ")


def test_serve_refuses_a_bad_otlp_endpoint_in_one_line_naming_the_flag_or_variable(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exited:  # argparse refuses the flag's value
        maitred_main(["serve", "--no-db", "--otlp-endpoint", "localhost:4318"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "maitred serve: error: argument --otlp-endpoint: expected an http:// or https:// URL of an OTLP/HTTP receiver, "
        "got 'localhost:4318' (see maitred serve --help)"
    )
    monkeypatch.setenv("MAITRED_OTLP_ENDPOINT", "ftp://collector")
    assert maitred_main(["serve", "--no-db"]) == 2
    assert capsys.readouterr().err.strip() == (
        "maitred: error: $MAITRED_OTLP_ENDPOINT: expected an http:// or https:// URL of an OTLP/HTTP receiver, got 'ftp://collector'"
    )


def test_the_gateway_exports_the_model_calls_it_proxies_under_the_program_posted_to_it(receiver):
    with BackgroundServer(create_app(SimWorkerConfig(gpu_tokens=50_000, time_scale=20.0))) as sim:
        gateway = build_app(
            ServeConfig([sim.url], runtime=LiveConfig(tick_s=0.2, poll_s=0.2), wait_for_workers_s=10, otlp_endpoint=receiver.url)
        )
        with BackgroundServer(gateway.app) as server:
            post = {"headers": {"content-type": "application/json"}, "timeout": 30}
            start = ProgramStart(ts=time.time(), program_id="p-gw", agent="coder")
            assert httpx.post(f"{server.url}/v1/events", content=dumps_batch([start]), **post).status_code == 200
            body = {
                "model": "sim",
                "program_id": "p-gw",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "fix it " * 50}],
            }
            answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
            assert answer.status_code == 200, answer.text
            end = ProgramEnd(ts=time.time(), program_id="p-gw", agent="coder")
            assert httpx.post(f"{server.url}/v1/events", content=dumps_batch([end]), **post).status_code == 200
        # the gateway's shutdown drained its exporter
    agent = receiver.named("invoke_agent coder")
    (chat,) = [s for s in receiver.spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    assert chat["parent"] == agent["span_id"] and chat["trace_id"] == agent["trace_id"] == f"{trace_id('p-gw'):032x}"
    usage = answer.json()["usage"]
    assert chat["attributes"]["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert chat["attributes"]["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert chat["attributes"]["maitred.worker"] == sim.url and chat["attributes"]["gen_ai.response.id"].startswith("gw-")
    assert "maitred.incomplete" not in chat["attributes"]


def test_a_start_carries_what_its_recorder_noted_for_its_span_and_the_note_is_taken_once():
    notes = SpanNotes()
    llm_start, tool_start = _program()[1], _program()[3]
    notes.put(span_key(llm_start), {"maitred.tier": "cpu", "maitred.worker": "w-home"})
    notes.put(span_key(tool_start), {"maitred.predicted_return_s": 2.5})
    spans = {f.span.name: f.span for f in SpanPairs(Resource({}), notes=notes).feed(_program())}
    chat, tool = spans["chat qwen"], spans["execute_tool pytest"]
    assert chat.attributes["maitred.tier"] == "cpu"
    assert chat.attributes["maitred.worker"] == "w0"  # where it ran (its llm.end) wins over its home at arrival
    assert tool.attributes["maitred.predicted_return_s"] == 2.5
    assert "maitred.tier" not in spans["invoke_agent planner"].attributes and len(notes) == 0


def test_notes_are_bounded_the_oldest_forgotten_first():
    notes = SpanNotes(max_notes=2)
    for i in range(3):
        notes.put(("tool", "p", f"c{i}"), {"maitred.predicted_return_s": float(i)})
    assert len(notes) == 2 and notes.take(("tool", "p", "c0")) == {}
    assert notes.take(("tool", "p", "c2")) == {"maitred.predicted_return_s": 2.0}
    with pytest.raises(ValueError, match="max_notes"):
        SpanNotes(max_notes=0)


def test_an_annotate_that_fails_costs_only_that_events_attributes_and_ends_are_not_annotated(receiver, caplog):
    seen: list[str] = []

    def annotate(event: Any) -> dict[str, Any]:
        seen.append(event.TYPE)
        if event.TYPE == "tool.start":
            raise KeyError("boom")
        return {"maitred.tier": "gpu"}

    sink = OtlpSink(receiver.url, annotate=annotate)
    events = _program()
    with caplog.at_level(logging.WARNING, logger="maitred"):
        for event in events:
            sink.note(event)
    assert seen == ["program.start", "llm.start", "tool.start"]
    assert "no span attributes for a tool.start event: KeyError('boom')" in caplog.text
    assert sink.send(events) == 0
    sink.close()
    assert receiver.named("chat qwen")["attributes"]["maitred.tier"] == "gpu"
    assert "maitred.tier" not in receiver.named("execute_tool pytest")["attributes"]


def test_the_gateway_exports_the_tier_worker_and_predicted_return_it_knew_when_it_recorded_each_start(receiver):
    sims = [BackgroundServer(create_app(SimWorkerConfig(gpu_tokens=50_000, time_scale=20.0))) for _ in range(2)]
    with sims[0] as sim_a, sims[1] as sim_b:
        gateway = build_app(
            ServeConfig(
                [sim_a.url, sim_b.url],
                runtime=LiveConfig(tick_s=60.0, poll_s=0.2),  # no step moves a program mid-test
                wait_for_workers_s=10,
                otlp_endpoint=receiver.url,
            )
        )
        with BackgroundServer(gateway.app) as server:
            post = {"headers": {"content-type": "application/json"}, "timeout": 30}

            def send(*events: Any) -> None:
                answer = httpx.post(f"{server.url}/v1/events", content=dumps_batch(list(events)), **post)
                assert answer.status_code == 200, answer.text

            def shown(pid: str) -> dict[str, Any]:
                answer = httpx.get(f"{server.url}/v1/programs/{pid}", timeout=30)
                assert answer.status_code == 200, answer.text
                return answer.json()

            t = time.time() - 60
            send(ProgramStart(ts=t, program_id="p-sig", agent="coder"), ProgramStart(ts=t, program_id="p-new"))
            # a tool the gateway has no statistics for, nor any tool yet: no prediction
            send(
                ToolStart(ts=t + 1, program_id="p-sig", call_id="c-first", tool="pytest"),
                ToolEnd(ts=t + 3, program_id="p-sig", call_id="c-first", duration_s=2.0),
            )
            body = {"model": "sim", "program_id": "p-sig", "max_tokens": 8, "messages": [{"role": "user", "content": "go " * 50}]}
            before_call = shown("p-sig")
            answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
            assert answer.status_code == 200, answer.text
            after_call = shown("p-sig")
            # a model call a client reports (its llm.end names no worker): the gateway's placement
            send(LLMStart(ts=t + 4, program_id="p-new", request_id="r-new", model="m"))
            new_program = shown("p-new")
            send(LLMEnd(ts=t + 5, program_id="p-new", request_id="r-new", prompt_tokens=10, completion_tokens=2))
            for i in range(5):  # statistics for pytest: min_history calls of it
                send(
                    ToolStart(ts=t + 10 + i, program_id="p-sig", call_id=f"c{i}", tool="pytest"),
                    ToolEnd(ts=t + 10.5 + i, program_id="p-sig", call_id=f"c{i}", duration_s=0.5 + 0.1 * i),
                )
            send(ToolStart(ts=time.time(), program_id="p-sig", call_id="c-last", tool="pytest"))
            while_open = shown("p-sig")
            send(ToolEnd(ts=time.time(), program_id="p-sig", call_id="c-last"))
            send(ProgramEnd(ts=time.time(), program_id="p-sig"), ProgramEnd(ts=time.time(), program_id="p-new"))
    chats = {s["attributes"]["gen_ai.conversation.id"]: s for s in receiver.spans if s["name"].startswith("chat")}
    chat = chats["p-sig"]["attributes"]
    # the tier it arrived in (its KV's place before the call), the worker it ran on
    assert chat["maitred.tier"] == before_call["tier"] and after_call["worker"] in (sim_a.url, sim_b.url)
    assert chat["maitred.worker"] == after_call["worker"]
    reported = chats["p-new"]["attributes"]
    assert (reported["maitred.tier"], reported.get("maitred.worker")) == (new_program["tier"], new_program["worker"])
    tools = {
        s["attributes"]["gen_ai.tool.call.id"]: s["attributes"] for s in receiver.spans if s["name"] == "execute_tool pytest"
    }
    assert "maitred.predicted_return_s" not in tools["c-first"] and "maitred.predicted_return_source" not in tools["c-first"]
    assert while_open["readiness_source"] == "tool" and tools["c-last"]["maitred.predicted_return_source"] == "tool"
    predicted = while_open["predicted_tool_end"] - while_open["tool"]["started"]
    assert tools["c-last"]["maitred.predicted_return_s"] == pytest.approx(predicted)
    assert 0.5 <= predicted <= 2.0  # within the recorded durations of pytest (c-first's 2.0 included)
