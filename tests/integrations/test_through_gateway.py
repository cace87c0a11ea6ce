"""Integrations against a running ``maitred serve`` gateway on simulated workers."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import maitred
from maitred.integrations.claude_code import child_program_id
from maitred.storage import SessionStore

FIXTURES = Path(__file__).parent / "fixtures" / "claude_code"
SESSION = "4f9c2d1e-8b7a-4c3d-9e2f-1a2b3c4d5e6f"


def until(check, timeout_s: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"{what} not reached within {timeout_s} s")


def test_langgraph_swarm_through_the_gateway_carries_the_program_id_on_every_request(cluster):
    pytest.importorskip("langchain_openai", reason="the langgraph extra is not installed")
    pytest.importorskip("langgraph_swarm", reason="the langgraph extra is not installed")
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from langgraph_swarm import create_handoff_tool, create_swarm

    from maitred.integrations.langgraph import MaitredCallbackHandler, MaitredMiddleware
    from tests.integrations.scripted import add, grep

    c = cluster()
    maitred.configure(runtime_url=c.url)
    sent: list[httpx.Request] = []
    client = httpx.Client(event_hooks={"request": [sent.append]}, timeout=60)

    def model() -> ChatOpenAI:
        return ChatOpenAI(
            base_url=f"{c.url}/v1", api_key="unused", model="maitred-sim-worker", max_tokens=32, http_client=client, max_retries=0
        )

    alice = create_agent(
        model(),
        [add, create_handoff_tool(agent_name="bob")],
        name="alice",
        middleware=[MaitredMiddleware(record_model_calls=False)],
    )
    bob = create_agent(model(), [grep], name="bob", middleware=[MaitredMiddleware(record_model_calls=False)])
    app = create_swarm([alice, bob], default_active_agent="alice").compile()
    assert c.program("swarm-gw") is None
    result = app.invoke(
        {"messages": [{"role": "user", "content": "add, then hand over to bob"}]},
        {"configurable": {"thread_id": "swarm-gw"}, "callbacks": [MaitredCallbackHandler(record_calls=False)]},
    )
    assert result["messages"][-1].content.startswith("Finished after")
    assert maitred.flush(timeout=10)

    chats = [r for r in sent if r.url.path == "/v1/chat/completions"]
    assert len(chats) == 4  # alice: add, transfer; bob: grep, final answer
    assert all(json.loads(r.content)["program_id"] == "swarm-gw" for r in chats)
    assert all(r.headers["x-program-id"] == "swarm-gw" for r in chats)

    until(lambda: c.program("swarm-gw") is None, what="the finished run leaving the runtime")  # ended, not acting
    with SessionStore(c.db_url) as store:
        timeline = until(
            lambda: (
                (t := store.program("swarm-gw"))
                and len(t.handoffs) == 1
                and len([s for s in t.spans if s.kind == "llm" and s.end]) == 4
                and t.program.status is not None
                and t
            ),
            what="the swarm in the store",
        )
    assert (timeline.program.framework, timeline.program.agent, timeline.program.status) == ("langgraph", "bob", "ok")
    assert {s.detail["worker"] for s in timeline.spans if s.kind == "llm"} <= set(c.worker_urls)
    tools = {s.detail["call_id"]: (s.name, s.agent) for s in timeline.spans if s.kind == "tool"}
    assert sorted(tools.values()) == [("add", "alice"), ("grep", "bob"), ("transfer_to_bob", "alice")]
    assert all(call_id.startswith("call_") for call_id in tools)
    assert (timeline.handoffs[0]["from_agent"], timeline.handoffs[0]["to_agent"]) == ("alice", "bob")
    assert len([s for s in timeline.spans if s.kind == "llm"]) == 4  # the gateway's, not counted twice


def test_claude_code_http_hook_payloads_drive_the_runtime(cluster):
    c = cluster()
    payloads = [json.loads(line) for line in (FIXTURES / "session.jsonl").read_text().splitlines()]
    with httpx.Client(base_url=c.url, timeout=10) as client:
        for payload in payloads[:5]:  # start ... the Agent call (still open)
            r = client.post("/v1/hooks/claude-code", json=payload)
            assert r.status_code == 200 and r.headers["x-maitred-mapped"] == "true" and r.json() == {}, r.text
        info = c.program(SESSION)
        assert info["phase"] == "acting" and info["tool"]["call_id"] == "toolu_01Agent1"
        assert info["tool"]["signature"] == "Agent:Explore"
        for payload in payloads[5:15]:  # the subagent, its tools, the Edit, the Monitor, Stop
            assert client.post("/v1/hooks/claude-code", json=payload).status_code == 200
        assert c.program(SESSION)["phase"] == "waiting_human"
        assert c.program(child_program_id(SESSION, "a3f9e1c07b2d4e85")) is None  # the child ended
        bad = client.post("/v1/hooks/claude-code", json={"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash"})
        assert bad.status_code == 400 and "tool_use_id" in bad.text
    with SessionStore(c.db_url) as store:
        timeline = until(
            lambda: (t := store.program(SESSION)) and len([s for s in t.spans if s.kind == "tool"]) == 4 and t,
            what="the session in the store",
        )
    assert (timeline.program.framework, timeline.program.status) == ("claude-code", None)  # SessionStart's, still running
    assert {s.detail["call_id"] for s in timeline.spans if s.kind == "tool"} == {
        "toolu_01Bash1",
        "toolu_01Agent1",
        "toolu_01Edit1",
        "toolu_01Mon1",
    }


def test_claude_code_command_hook_reaches_the_running_runtime(cluster, tmp_path):
    c = cluster()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAITRED_")}
    payload = json.loads((FIXTURES / "session.jsonl").read_text().splitlines()[2])
    done = subprocess.run(
        [sys.executable, "-m", "maitred.integrations.claude_code"],  # the entry point older settings name
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "MAITRED_URL": c.url, "MAITRED_SPOOL_DIR": str(tmp_path / "spool"), "MAITRED_HOOK_LINGER_S": "0.5"},
    )
    assert (done.returncode, done.stderr) == (0, "")
    info = until(lambda: c.program(SESSION), what="the hook's events in the runtime")
    assert info["tool"] == {
        "call_id": "toolu_01Bash1",
        "tool": "Bash",
        "signature": "Bash:pytest",
        "started": info["tool"]["started"],
    }
