"""The simulated worker's Anthropic (``/v1/messages``, ``count_tokens``) and Responses API
(``/v1/responses``) endpoints: shapes, streams in each API's event sequence, usage that matches
the chat endpoint's for the same conversation, ``--script-tools`` as ``tool_use`` blocks and
``function_call`` items, and errors in each API's shape. A real uvicorn server on 127.0.0.1."""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.server import SimWorkerThread

SYSTEM = "You are a careful coding agent. Follow the repository conventions. " * 4
BASH = {
    "name": "Bash",
    "description": "run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"],
    },
}


@pytest.fixture
def worker() -> Iterator[SimWorkerThread]:
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=200_000, time_scale=50.0, script_tools=True)) as w:
        yield w


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The (event name, data) pairs of a server-sent-event stream with named events."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def claude_code_body(**extra: Any) -> dict[str, Any]:
    """A request shaped like Claude Code's: system as blocks, content as blocks, tools, thinking, metadata."""
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "fix the failing test in tests/test_core.py"}]}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "user_ab12_account__session_0f3c"},
        **extra,
    }


def test_a_message_gets_text_blocks_end_turn_and_sglangs_usage_with_cache_reads_on_the_next_turn(worker):
    body = claude_code_body()
    first = httpx.post(worker.url + "/v1/messages", json=body, timeout=30)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert (answer["type"], answer["role"], answer["model"], answer["stop_reason"]) == (
        "message",
        "assistant",
        "claude-sonnet-4-5",
        "end_turn",
    )
    assert [b["type"] for b in answer["content"]] == ["text"] and answer["content"][0]["text"]
    assert answer["usage"]["input_tokens"] > 40 and answer["usage"]["output_tokens"] > 0
    body["messages"] += [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "and now the docs"}]
    second = httpx.post(worker.url + "/v1/messages", json=body, timeout=30).json()["usage"]
    assert second["input_tokens"] > answer["usage"]["input_tokens"] + answer["usage"]["output_tokens"]
    # the previous turn's prompt and answer were cached: SGLang counts them in input_tokens too
    assert answer["usage"]["input_tokens"] <= second["cache_read_input_tokens"] < second["input_tokens"]


def test_a_small_max_tokens_is_the_length_and_stops_for_max_tokens(worker):
    answer = httpx.post(worker.url + "/v1/messages", json=claude_code_body(max_tokens=3), timeout=30).json()
    assert answer["stop_reason"] == "max_tokens" and answer["usage"]["output_tokens"] == 3


def test_a_message_stream_is_anthropics_event_sequence_with_the_same_text_and_usage(worker):
    whole = httpx.post(worker.url + "/v1/messages", json=claude_code_body(), timeout=30).json()
    r = httpx.post(worker.url + "/v1/messages", json=claude_code_body(stream=True), timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    seq = events(r.text)
    names = [name for name, _ in seq]
    assert names[:2] == ["message_start", "content_block_start"] and names[-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in seq)
    text = "".join(data["delta"]["text"] for name, data in seq if name == "content_block_delta")
    assert text == whole["content"][0]["text"]
    delta = seq[-2][1]
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert seq[0][1]["message"]["usage"]["input_tokens"] == whole["usage"]["input_tokens"]


def test_script_tools_answer_with_tool_use_blocks_until_the_tool_results_make_the_final_message(worker):
    body = claude_code_body(tools=[BASH])
    for step in range(3):
        answer = httpx.post(worker.url + "/v1/messages", json=body, timeout=30).json()
        assert answer["stop_reason"] == "tool_use", answer
        (use,) = answer["content"]
        assert use["type"] == "tool_use" and use["name"] == "Bash" and use["input"] == {"command": f"command-{step}"}
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": [{"type": "text", "text": "ok"}]}
        # Claude Code puts reminders next to tool results: still the same turn
        reminder = {"type": "text", "text": "<system-reminder>keep going</system-reminder>"}
        body["messages"] += [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": [result, reminder]}]
    final = httpx.post(worker.url + "/v1/messages", json=body, timeout=30).json()
    assert final["stop_reason"] == "end_turn" and final["content"][0]["text"] == "Finished after 3 tool calls ."


def test_a_streamed_tool_use_is_a_tool_use_block_with_its_input_as_json_deltas(worker):
    r = httpx.post(worker.url + "/v1/messages", json=claude_code_body(tools=[BASH], stream=True), timeout=30)
    seq = events(r.text)
    assert [n for n, _ in seq] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    block = seq[1][1]["content_block"]
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "Bash", {})
    assert json.loads(seq[2][1]["delta"]["partial_json"]) == {"command": "command-0"}
    assert seq[4][1]["delta"]["stop_reason"] == "tool_use"


def test_count_tokens_is_the_prompt_a_message_would_render(worker):
    body = claude_code_body(tools=[BASH])
    counted = httpx.post(
        worker.url + "/v1/messages/count_tokens", json={k: body[k] for k in ("model", "system", "messages", "tools")}
    )
    assert counted.status_code == 200
    answer = httpx.post(worker.url + "/v1/messages", json={**body, "tool_choice": {"type": "none"}}, timeout=30).json()
    assert counted.json() == {"input_tokens": answer["usage"]["input_tokens"]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m", "max_tokens": 8}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
    ],
)
def test_a_bad_message_gets_anthropics_error_naming_the_field(worker, body, field):
    r = httpx.post(worker.url + "/v1/messages", json=body)
    assert r.status_code == 400
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(field + ":")


def test_a_response_is_a_message_item_with_usage_and_cached_tokens_on_the_next_turn(worker):
    body: dict[str, Any] = {"model": "gpt-5-codex", "instructions": SYSTEM, "input": "list the files"}
    first = httpx.post(worker.url + "/v1/responses", json=body, timeout=30).json()
    assert (first["object"], first["status"]) == ("response", "completed")
    (item,) = first["output"]
    assert item["type"] == "message" and item["content"][0]["type"] == "output_text" and item["content"][0]["text"]
    body["input"] = [
        {"role": "user", "content": [{"type": "input_text", "text": "list the files"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": item["content"][0]["text"]}]},
        {"role": "user", "content": "now the tests"},
    ]
    usage = httpx.post(worker.url + "/v1/responses", json=body, timeout=30).json()["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_a_response_stream_ends_with_response_completed_carrying_the_text_and_usage(worker):
    body = {"model": "m", "input": "list the files", "stream": True}
    seq = events(httpx.post(worker.url + "/v1/responses", json=body, timeout=30).text)
    names = [n for n, _ in seq]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in seq] == list(range(len(seq)))
    text = "".join(d["delta"] for n, d in seq if n == "response.output_text.delta")
    done = seq[-1][1]["response"]
    assert done["output"][0]["content"][0]["text"] == text and done["usage"]["output_tokens"] > 0


def test_script_tools_answer_a_response_with_function_call_items(worker):
    tool = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
    body: dict[str, Any] = {"model": "m", "input": "build it", "tools": [tool]}
    (call,) = httpx.post(worker.url + "/v1/responses", json=body, timeout=30).json()["output"]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "shell", {"cmd": "cmd-0"})
    body["input"] = ["build it", call, {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]
    body["input"][0] = {"role": "user", "content": "build it"}
    streamed = events(httpx.post(worker.url + "/v1/responses", json={**body, "stream": True}, timeout=30).text)
    assert "response.function_call_arguments.done" in [n for n, _ in streamed]
    assert json.loads(streamed[-1][1]["response"]["output"][0]["arguments"]) == {"cmd": "cmd-1"}


def test_a_bad_response_request_gets_sglangs_openai_error_naming_the_field(worker):
    r = httpx.post(worker.url + "/v1/responses", json={"model": "m", "input": 7})
    assert r.status_code == 400 and r.json()["message"].startswith("input:")


def test_a_system_message_mid_conversation_is_a_chat_system_message():
    """Claude Code 2.1.3xx sends ``role: system`` messages among ``messages`` (its per-turn
    control beta); they become system messages of the chat request, in place."""
    from maitred.sim.worker.dialects import anthropic_to_chat

    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "SCRIPT:main go"},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
        ],
    }
    chat = anthropic_to_chat(body)
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [("user", "SCRIPT:main go"), ("system", "# Environment")]
