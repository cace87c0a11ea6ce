"""The OTLP export read back from Arize Phoenix: an instrumented program through
``maitred.configure(otlp_endpoint=...)``, and events posted to ``maitred serve --otlp-endpoint``."""

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

import maitred
from maitred.bind import wait_http
from maitred.events import ProgramEnd, ProgramStart, ToolEnd, ToolStart, dumps_batch
from maitred.harness.background import free_port
from maitred.middleware.otlp_spans import span_context, trace_id
from tests.integrations.phoenix import Phoenix, phoenix_server  # noqa: F401 (the fixture)

# Building Phoenix's venv (first run only) and starting it outlast the default timeout.
pytestmark = pytest.mark.timeout(1500)
REPO = Path(__file__).parents[2]


def _hex_trace(program_id: str) -> str:
    return f"{trace_id(program_id):032x}"


def _hex_span(*parts: str) -> str:
    return f"{span_context(*parts).span_id:016x}"


def test_an_instrumented_program_shows_in_phoenix_as_one_trace_of_genai_spans(phoenix: Phoenix, tmp_path):
    maitred.configure(db_url=f"sqlite:///{tmp_path / 'm.db'}", otlp_endpoint=phoenix.url)

    @maitred.tool
    def grep(pattern: str) -> str:
        return f"src/app.py:12: {pattern}"

    @maitred.tool(name="pytest", timeout=600)
    def run_tests() -> str:
        raise RuntimeError("2 failed")

    with maitred.program("phx-1", agent="planner", framework="hand-written"):
        with maitred.llm_call(model="qwen-7b", prompt_tokens=900) as step:
            step.finish(prompt_tokens=912, completion_tokens=40, cached_tokens=512, worker="http://w0")
        grep("def main")
        with pytest.raises(RuntimeError):
            run_tests()
        maitred.handoff("coder", child_program_id="phx-1/coder", context_tokens=912)
    assert maitred.flush(20)

    spans = {s["name"]: s for s in phoenix.wait_for_spans(4, trace_id=_hex_trace("phx-1"))}
    assert set(spans) == {"invoke_agent planner", "chat qwen-7b", "execute_tool grep", "execute_tool pytest"}
    agent = spans["invoke_agent planner"]
    assert agent["parent_id"] is None and agent["context"]["span_id"] == _hex_span("phx-1")
    assert all(s["parent_id"] == agent["context"]["span_id"] for name, s in spans.items() if name != agent["name"])
    assert (agent["span_kind"], spans["chat qwen-7b"]["span_kind"], spans["execute_tool grep"]["span_kind"]) == (
        "AGENT",
        "LLM",
        "TOOL",
    )

    assert agent["attributes"]["gen_ai.conversation.id"] == "phx-1" and agent["attributes"]["gen_ai.agent.name"] == "planner"
    assert agent["attributes"]["maitred.framework"] == "hand-written"
    (handoff,) = agent["events"]
    assert handoff["name"] == "handoff" and handoff["attributes"]["maitred.to_agent"] == "coder"
    assert handoff["attributes"]["maitred.child_program_id"] == "phx-1/coder"

    chat = spans["chat qwen-7b"]["attributes"]
    assert chat["gen_ai.operation.name"] == "chat" and chat["gen_ai.request.model"] == "qwen-7b"
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (912, 40)
    assert chat["gen_ai.usage.cache_read.input_tokens"] == 512 and chat["maitred.worker"] == "http://w0"

    grep_span, tests = spans["execute_tool grep"], spans["execute_tool pytest"]
    assert grep_span["attributes"]["gen_ai.tool.name"] == "grep" and grep_span["status_code"] == "UNSET"
    assert grep_span["attributes"]["gen_ai.tool.call.id"] != tests["attributes"]["gen_ai.tool.call.id"]
    assert tests["attributes"]["maitred.deadline_s"] == 600 and tests["attributes"]["maitred.status"] == "error"
    assert tests["status_code"] == "ERROR"
    assert not any("maitred.incomplete" in s["attributes"] for s in spans.values())


def test_events_posted_to_the_gateway_show_in_phoenix(phoenix: Phoenix, tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "maitred", "serve", "--no-db", "--port", str(port), "--otlp-endpoint", phoenix.url]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(tmp_path / "gateway.log", "w") as log:
        gateway = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/healthz", timeout_s=60, process=gateway)
            now = time.time()
            events = [
                ProgramStart(ts=now, program_id="phx-gw", agent="reviewer"),
                ToolStart(ts=now + 0.1, program_id="phx-gw", agent="reviewer", call_id="c1", tool="git_diff", deadline_s=30.0),
                ToolEnd(ts=now + 0.3, program_id="phx-gw", agent="reviewer", call_id="c1", duration_s=0.2),
                ProgramEnd(ts=now + 0.4, program_id="phx-gw", agent="reviewer"),
            ]
            answer = httpx.post(f"{url}/v1/events", content=dumps_batch(events), headers={"content-type": "application/json"})
            assert answer.status_code == 200, answer.text
            spans = {s["name"]: s for s in phoenix.wait_for_spans(2, trace_id=_hex_trace("phx-gw"))}
        finally:
            gateway.terminate()
            gateway.wait(60)
    assert set(spans) == {"invoke_agent reviewer", "execute_tool git_diff"}, (tmp_path / "gateway.log").read_text()
    tool = spans["execute_tool git_diff"]
    assert tool["parent_id"] == spans["invoke_agent reviewer"]["context"]["span_id"]
    assert tool["attributes"]["gen_ai.tool.call.id"] == "c1" and tool["attributes"]["maitred.deadline_s"] == 30
    assert tool["attributes"]["gen_ai.conversation.id"] == "phx-gw"
