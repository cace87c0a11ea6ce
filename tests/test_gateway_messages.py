"""The gateway for Anthropic and Responses API clients (Claude Code, Codex CLI): ``/v1/messages``
streaming and not, ``count_tokens``, ``/v1/responses`` and ``GET /v1/models`` through a real
gateway in front of a real simulated SGLang worker, each under uvicorn on 127.0.0.1; program ids
from Claude Code's header and ``metadata.user_id``; usage in the state and the store; errors in
each route's shape; and ``maitred serve`` without workers, as a real process."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.loop import LiveConfig
from maitred.gateway.programid import take_program_id
from maitred.harness.background import BackgroundServer
from maitred.identity import claude_code_session
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SERVED_MODEL_NAME, SimWorkerConfig
from maitred.storage import SessionStore
from tests.helpers import free_port, wait_until
from tests.test_simworker_dialects import BASH, claude_code_body, events

FAST = LiveConfig(tick_s=0.2, poll_s=0.2, hold_timeout_s=30.0)
SESSION = "5a1f0c2e-8d7b-4c1e-9f00-3b2a1c0d9e8f"


@dataclass
class Served:
    url: str
    worker: str


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    """One simulated worker (``--script-tools``) behind a gateway; ``db_url`` when the test asks for it."""
    db_url = request.getfixturevalue("db_url") if "db_url" in request.fixturenames else None
    with ExitStack() as stack:
        sim = stack.enter_context(
            BackgroundServer(create_app(SimWorkerConfig(gpu_tokens=200_000, time_scale=50.0, script_tools=True)))
        )
        gateway = build_app(ServeConfig([sim.url], runtime=FAST, wait_for_workers_s=10, db_url=db_url))
        server = stack.enter_context(BackgroundServer(gateway.app))
        yield Served(server.url, sim.url)


def shape(seq: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The event names of a stream, runs of one name counted once."""
    return [name for i, (name, _) in enumerate(seq) if i == 0 or seq[i - 1][0] != name]


def program(url: str, pid: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/programs/{pid}")
    assert r.status_code == 200, r.text
    info: dict[str, Any] = r.json()
    return info


def test_claude_codes_session_is_read_from_both_user_id_formats_and_user_id_is_left_in_the_body():
    legacy = f"user_9f86d081884c7d65_account_0e5b2a7c-1111-4222-8333-944455556666_session_{SESSION}"
    assert claude_code_session(legacy) == SESSION
    assert claude_code_session(f"user_9f86_account__session_{SESSION}") == SESSION
    modern = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": SESSION})
    assert claude_code_session(modern) == SESSION
    for other in ("someone@example.com", "{not json", json.dumps({"device_id": "d"}), 7):
        assert claude_code_session(other) is None
    body = {"metadata": {"user_id": modern}, "messages": []}
    assert take_program_id(body, {}) == (SESSION, False) and body["metadata"] == {"user_id": modern}
    # the header and maitred's own id come first; maitred's key is stripped, Claude Code's is not
    body = {"metadata": {"user_id": modern, "program_id": "mine"}}
    assert take_program_id(body, {"x-claude-code-session-id": "hdr"}) == ("mine", True)
    assert body == {"metadata": {"user_id": modern}}
    assert take_program_id({"metadata": {"user_id": modern}}, {"x-claude-code-session-id": "hdr"})[0] == "hdr"


def test_messages_pass_through_under_claude_codes_session_header_and_their_usage_reaches_state_and_store(served, db_url):
    headers = {"x-claude-code-session-id": SESSION, "anthropic-version": "2023-06-01", "x-api-key": "sk-ant-unused"}
    body = claude_code_body()
    first = httpx.post(served.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["type"] == "message" and answer["content"][0]["type"] == "text"
    body["messages"] += [{"role": "assistant", "content": answer["content"]}, {"role": "user", "content": "go on"}]
    usage = httpx.post(served.url + "/v1/messages", json=body, headers=headers, timeout=30).json()["usage"]
    info = program(served.url, SESSION)
    assert info["worker"] == served.worker
    assert (info["last_prompt_tokens"], info["last_cached_tokens"]) == (usage["input_tokens"], usage["cache_read_input_tokens"])
    assert usage["cache_read_input_tokens"] > 0
    with SessionStore(db_url) as store:

        def ends() -> list[dict[str, Any]]:
            return [e for e in store.events(SESSION) if e["type"] == "llm.end"]

        assert wait_until(lambda: len(ends()) == 2)
        last = ends()[-1]
        assert (last["prompt_tokens"], last["completion_tokens"], last["cached_tokens"]) == (
            usage["input_tokens"],
            usage["output_tokens"],
            usage["cache_read_input_tokens"],
        )


def test_a_message_stream_under_metadata_user_id_passes_through_and_records_its_usage(served):
    user_id = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": SESSION})
    body = claude_code_body(stream=True, metadata={"user_id": user_id})
    with httpx.Client(timeout=30) as client:
        straight = events(client.post(served.worker + "/v1/messages", json=body).text)
        through = events(client.post(served.url + "/v1/messages", json=body).text)
    # how many deltas carry the text depends on timing; the text and the sequence around it do not
    assert (
        shape(through)
        == shape(straight)
        == ["message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    )
    text = "".join(d["delta"]["text"] for n, d in through if n == "content_block_delta")
    assert text and text == "".join(d["delta"]["text"] for n, d in straight if n == "content_block_delta")
    usage = through[-2][1]["usage"]
    info = program(served.url, SESSION)
    assert (info["last_prompt_tokens"], info["last_cached_tokens"]) == (usage["input_tokens"], usage["cache_read_input_tokens"])
    assert usage["cache_read_input_tokens"] > 0  # the same prompt went straight to the worker first


def test_tool_use_blocks_come_through_and_count_tokens_is_answered_by_the_worker_without_admission(served):
    headers = {"x-claude-code-session-id": "cc-tools"}
    body = claude_code_body(tools=[BASH], stream=True)
    seq = events(httpx.post(served.url + "/v1/messages", json=body, headers=headers, timeout=30).text)
    assert seq[1][1]["content_block"]["type"] == "tool_use" and seq[-2][1]["delta"]["stop_reason"] == "tool_use"
    counting = {k: body[k] for k in ("model", "system", "messages", "tools")}
    through = httpx.post(
        served.url + "/v1/messages/count_tokens", json=counting, headers={"x-claude-code-session-id": "cc-count"}
    )
    assert through.status_code == 200
    assert through.json() == httpx.post(served.worker + "/v1/messages/count_tokens", json=counting).json()
    assert through.json()["input_tokens"] > 0
    assert httpx.get(served.url + "/v1/programs/cc-count").status_code == 404  # counting is no model step


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"messages": None}, "messages"),
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"model": None}, "model"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_a_bad_message_gets_an_anthropic_error_naming_the_field_and_no_program(served, change, field):
    body = {k: v for k, v in {**claude_code_body(), **change}.items() if v is not None}
    r = httpx.post(served.url + "/v1/messages", json=body, headers={"x-claude-code-session-id": "cc-bad"})
    assert r.status_code == 400
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(field + ":")
    assert httpx.get(served.url + "/v1/programs/cc-bad").status_code == 404
    not_json = httpx.post(served.url + "/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["error"]["message"].startswith("body:")


def test_responses_pass_through_with_their_usage_and_models_lists_the_workers_model(served):
    body = {"model": SERVED_MODEL_NAME, "instructions": "be brief " * 20, "input": "list the files", "program_id": "codex-1"}
    first = httpx.post(served.url + "/v1/responses", json=body, timeout=30)
    assert first.status_code == 200 and first.json()["output"][0]["type"] == "message"
    streamed = events(httpx.post(served.url + "/v1/responses", json={**body, "stream": True}, timeout=30).text)
    usage = streamed[-1][1]["response"]["usage"]
    info = program(served.url, "codex-1")
    assert (info["last_prompt_tokens"], info["last_cached_tokens"]) == (
        usage["input_tokens"],
        usage["input_tokens_details"]["cached_tokens"],
    )
    assert usage["input_tokens_details"]["cached_tokens"] > 0
    models = httpx.get(served.url + "/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [SERVED_MODEL_NAME]


def test_a_gateway_without_workers_serves_telemetry_and_says_so_on_every_model_route(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "maitred", "serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'm.db'}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/healthz").status_code == 200
        except httpx.TransportError:
            return process.poll() is not None

    try:
        assert wait_until(up, timeout=60) and process.poll() is None, process.stderr.read() if process.stderr else ""
        health = httpx.get(url + "/healthz").json()
        assert health["telemetry_only"] is True and health["workers"] == {} and "no workers" in health["status"]
        hook = {
            "session_id": "cc-t",
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_use_id": "t1",
            "tool_input": {"command": "ls"},
        }
        assert httpx.post(url + "/v1/hooks/claude-code", json=hook).headers["x-maitred-accepted"] == "1"
        assert httpx.get(url + "/v1/programs/cc-t").json()["phase"] == "acting"
        assert httpx.get(url + "/metrics").status_code == 200
        messages = httpx.post(url + "/v1/messages", json=claude_code_body())
        assert messages.status_code == 503 and messages.json()["type"] == "error"
        assert "without workers" in messages.json()["error"]["message"]
        for method, path in (("POST", "/v1/chat/completions"), ("POST", "/v1/responses"), ("GET", "/v1/models")):
            r = httpx.request(method, url + path, json={"model": "m", "messages": []} if method == "POST" else None)
            assert r.status_code == 503 and "without workers" in r.json()["error"]["message"], (path, r.text)
    finally:
        process.terminate()
        process.wait(30)
