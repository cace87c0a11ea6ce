"""Claude Code hooks: the mapping of every hook event, and the command hook as a real process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import maitred
from maitred.events import BACKGROUND_WAIT, Handoff, ProgramStart, ToolEnd, ToolStart
from maitred.integrations.claude_code import (
    HOOK_EVENTS,
    HookPayloadError,
    child_program_id,
    command_word,
    handle_payload,
    to_events,
    wire_events,
)
from maitred.integrations.claude_code_hook import settings_json
from maitred.storage import SessionStore
from tests.helpers import EventServer, free_port, wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "claude_code"
SESSION = "4f9c2d1e-8b7a-4c3d-9e2f-1a2b3c4d5e6f"
CHILD = child_program_id(SESSION, "a3f9e1c07b2d4e85")
T0 = 1_790_000_000.0


def session_payloads() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / "session.jsonl").read_text().splitlines()]


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def mapped_session() -> list[Any]:
    return [e for i, p in enumerate(session_payloads()) for e in to_events(p, T0 + i)]


def test_a_whole_session_maps_to_programs_tools_handoffs_and_a_human_wait():
    events = mapped_session()
    assert [e.TYPE for e in events] == [
        "program.start",
        "program.resume",
        "tool.start",
        "tool.end",  # Bash pytest
        "tool.start",  # Agent (stays open while the child runs)
        "program.start",
        "handoff",  # SubagentStart
        "tool.start",
        "tool.end",  # Grep inside the subagent
        "program.end",
        "handoff",  # SubagentStop: child ends, hand-back
        "tool.end",  # Agent returns
        "tool.start",
        "tool.end",  # Edit fails
        "tool.start",
        "tool.end",  # Monitor
        "program.wait",
        "program.resume",
        "program.end",
    ]
    bash_start, bash_end = events[2], events[3]
    assert isinstance(bash_start, ToolStart) and isinstance(bash_end, ToolEnd)
    assert (bash_start.call_id, bash_start.tool, bash_start.signature) == ("toolu_01Bash1", "Bash", "Bash:pytest")
    assert bash_start.deadline_s == 300.0 and not bash_start.background
    assert (bash_end.call_id, bash_end.status, bash_end.duration_s) == ("toolu_01Bash1", "ok", 4.873)
    assert all(e.program_id == SESSION and e.agent == "main" for e in (bash_start, bash_end))

    agent_call = events[4]
    assert (agent_call.call_id, agent_call.tool, agent_call.signature) == ("toolu_01Agent1", "Agent", "Agent:Explore")

    child_start, handoff = events[5], events[6]
    assert isinstance(child_start, ProgramStart) and isinstance(handoff, Handoff)
    assert (child_start.program_id, child_start.parent_program_id, child_start.agent) == (CHILD, SESSION, "Explore")
    assert (handoff.program_id, handoff.from_agent, handoff.to_agent, handoff.child_program_id) == (
        SESSION,
        "main",
        "Explore",
        CHILD,
    )

    grep_start, grep_end = events[7], events[8]
    assert (grep_start.program_id, grep_start.agent, grep_start.call_id) == (CHILD, "Explore", "toolu_01Grep1")
    assert (grep_end.program_id, grep_end.duration_s) == (CHILD, 0.038)

    child_end, hand_back = events[9], events[10]
    assert (child_end.program_id, child_end.status) == (CHILD, "ok")
    assert (hand_back.program_id, hand_back.from_agent, hand_back.to_agent) == (SESSION, "Explore", "main")
    assert hand_back.messages == [{"role": "assistant", "content": "The total is computed in cart.py, Cart.total()."}]

    assert events[11].call_id == "toolu_01Agent1" and events[11].duration_s == 9.12
    assert (events[13].call_id, events[13].status) == ("toolu_01Edit1", "error")
    monitor = events[14]
    assert (monitor.signature, monitor.deadline_s) == ("Monitor:tail", 600.0)
    assert events[16].reason == "human"
    assert [e.ts for e in events] == sorted(e.ts for e in events)


@pytest.mark.parametrize(
    ("name", "expect"),
    [
        ("pre_tool_use_bash_background.json", {"type": "tool.start", "background": True, "signature": "Bash:npm"}),
        ("pre_tool_use_monitor_persistent.json", {"type": "tool.start", "signature": "Monitor:gh"}),
        ("post_tool_use_failure_interrupt.json", {"type": "tool.end", "status": "interrupted", "duration_s": 2.21}),
        ("post_tool_use_failure_timeout.json", {"type": "tool.end", "status": "timeout"}),
        ("stop_failure.json", {"type": "program.wait", "reason": "api_error"}),
        ("user_prompt_submit_wakeup.json", {"type": "program.resume"}),
    ],
)
def test_edge_payloads_map_as_documented(name, expect):
    [wire] = wire_events(fixture(name), T0)
    assert {k: wire.get(k) for k in expect} == expect
    if expect["type"] == "tool.start":
        assert "deadline_s" not in wire  # background launch declares none; persistent Monitor has none


def test_a_stop_on_running_background_work_is_a_background_wait():
    [wire] = wire_events(fixture("stop_background_running.json"), T0)
    assert (wire["type"], wire["reason"]) == ("program.wait", BACKGROUND_WAIT)


@pytest.mark.parametrize("name", ["session_start_compact.json", "notification.json"])
def test_payloads_that_start_no_wait_or_program_map_to_nothing(name):
    assert to_events(fixture(name), T0) == []


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ([1, 2], "payload"),
        ({"hook_event_name": "PreToolUse"}, "session_id"),
        ({"session_id": "s", "hook_event_name": 7}, "hook_event_name"),
        ({"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash"}, "tool_use_id"),
        (
            {
                "session_id": "s",
                "hook_event_name": "PreToolUse",
                "tool_name": "Bash",
                "tool_use_id": "t",
                "tool_input": {"command": "ls", "timeout": "120000"},
            },
            "tool_input.timeout",
        ),
        (
            {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_use_id": "t", "tool_input": "ls"},
            "tool_input",
        ),
        ({"session_id": "s", "hook_event_name": "PostToolUse", "tool_use_id": "t", "duration_ms": -4}, "duration_ms"),
        ({"session_id": "s", "hook_event_name": "Stop", "background_tasks": {"id": "x"}}, "background_tasks"),
        ({"session_id": "s", "hook_event_name": "SubagentStart", "agent_type": "Explore"}, "agent_id"),
        ({"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Read", "tool_use_id": "t" * 300}, "tool_use_id"),
    ],
)
def test_malformed_payloads_raise_naming_the_field(payload, field):
    with pytest.raises(HookPayloadError) as info:
        to_events(payload, T0)
    assert info.value.field == field
    assert str(info.value).startswith(field)


@pytest.mark.parametrize(
    ("command", "word"),
    [
        ("pytest -x tests", "pytest"),
        ("  PYTHONPATH=. CI=1 python -m pytest", "python"),
        ("cd /repo && npm test", "npm"),
        ("/usr/local/bin/cargo build", "cargo"),
        ("cd /repo", "cd"),
        ("   ", None),
    ],
)
def test_signature_takes_the_program_a_command_runs(command, word):
    assert command_word(command) == word


def test_handle_payload_writes_the_session_through_the_emitter_to_the_store(db_url):
    maitred.configure(db_url=db_url)
    now = time.time() - 100
    for i, payload in enumerate(session_payloads()):
        handle_payload(payload, now + i)
    assert maitred.flush(timeout=10)
    with SessionStore(db_url) as store:
        parent = store.program(SESSION)
        child = store.program(CHILD)
    assert parent is not None and child is not None
    assert parent.program.framework == "claude-code" and parent.program.ended_at is not None
    tools = {s.detail["call_id"]: s for s in parent.spans if s.kind == "tool"}
    assert set(tools) == {"toolu_01Bash1", "toolu_01Agent1", "toolu_01Edit1", "toolu_01Mon1"}
    assert tools["toolu_01Bash1"].name == "Bash:pytest" and tools["toolu_01Bash1"].detail["deadline_s"] == 300.0
    assert tools["toolu_01Edit1"].status == "error"
    [wait] = [s for s in parent.spans if s.kind == "wait"]
    assert wait.end is not None and wait.end - wait.start == pytest.approx(1.0)
    assert [(h["from_agent"], h["to_agent"], h["child_program_id"]) for h in parent.handoffs] == [
        ("main", "Explore", CHILD),
        ("Explore", "main", None),
    ]
    assert child.program.parent_program_id == SESSION
    assert [s.detail["call_id"] for s in child.spans if s.kind == "tool"] == ["toolu_01Grep1"]


# -- the command hook as a process ------------------------------------------------------------


@pytest.fixture
def spool_env(tmp_path) -> dict[str, str]:
    """Each test its own spool (never the user's), and deliverers that do not linger."""
    return {"MAITRED_SPOOL_DIR": str(tmp_path / "spool"), "MAITRED_HOOK_LINGER_S": "0.5"}


def hook(payload: bytes | str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAITRED_")}
    data = payload if isinstance(payload, str) else payload.decode()
    return subprocess.run(
        [sys.executable, "-m", "maitred.integrations.claude_code_hook", *args],
        input=data,
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
    )


def store_events(url: str, program_id: str) -> list[dict[str, Any]]:
    with SessionStore(url) as store:
        return store.events(program_id)


def stored_eventually(url: str, program_id: str, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The program's stored events once ``count`` are there (a deliverer writes them)."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal found
        try:
            found = store_events(url, program_id)
        except Exception:  # the deliverer may still be creating the schema
            return False
        return len(found) >= count

    wait_until(enough, timeout=timeout, interval=0.1)
    return found


def test_command_hook_writes_to_the_store_and_exits_0(db_url, spool_env):
    for payload in session_payloads()[:4]:
        done = hook(json.dumps(payload), "--foreground", env={**spool_env, "MAITRED_DB": db_url})
        # Nothing on stdout: Claude Code adds a SessionStart / UserPromptSubmit hook's stdout to the context.
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    kinds = [e["type"] for e in store_events(db_url, SESSION)]
    assert kinds == ["program.start", "program.resume", "tool.start", "tool.end"]


def test_one_background_deliverer_stores_a_burst_of_hooks_in_order(tmp_path, spool_env):
    url = f"sqlite:///{tmp_path / 'hooks.db'}"
    payloads = session_payloads()
    for payload in payloads:
        done = hook(json.dumps(payload), env={**spool_env, "MAITRED_DB": url})
        assert (done.returncode, done.stderr) == (0, "")
    want = [e["type"] for e in wire_events_of(payloads) if e["program_id"] == SESSION]
    found = stored_eventually(url, SESSION, len(want))
    assert sorted(e["type"] for e in found) == sorted(want)
    assert [(e["type"], e.get("call_id")) for e in found][:3] == [
        ("program.start", None),
        ("program.resume", None),
        ("tool.start", "toolu_01Bash1"),
    ]


def wire_events_of(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for p in payloads for e in wire_events(p, T0)]


def test_the_default_store_is_per_user_not_in_the_project_folder(tmp_path, spool_env):
    project = tmp_path / "project"
    project.mkdir()
    state = tmp_path / "state"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAITRED_")}
    done = subprocess.run(
        [sys.executable, "-m", "maitred.integrations.claude_code_hook", "--foreground"],
        input=json.dumps(session_payloads()[2]),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=project,
        env={**clean, **spool_env, "XDG_STATE_HOME": str(state)},
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert not (project / "maitred.db").exists()
    found = store_events(f"sqlite:///{state / 'maitred' / 'maitred.db'}", SESSION)
    assert [e["call_id"] for e in found] == ["toolu_01Bash1"]


def test_a_sigterm_right_after_the_hook_starts_loses_nothing(tmp_path, spool_env):
    """Claude Code cancels async hooks still running when a headless turn ends: the settings'
    ``trap '' TERM; exec`` keeps the signal ignored from the first instruction."""
    url = f"sqlite:///{tmp_path / 'term.db'}"
    settings = json.loads(settings_json())
    command = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MAITRED_")}
    for payload in session_payloads()[2:6]:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**clean, **spool_env, "MAITRED_DB": url},
            start_new_session=True,
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(payload).encode())
        proc.stdin.close()
        time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGTERM)  # as Claude Code cancels the hook
        assert proc.wait(timeout=30) == 0
    want = [e for e in wire_events_of(session_payloads()[2:6])]
    found = stored_eventually(url, SESSION, sum(1 for e in want if e["program_id"] == SESSION))
    assert sorted((e["type"], e.get("call_id")) for e in found) == sorted(
        (e["type"], e.get("call_id")) for e in want if e["program_id"] == SESSION
    )


def test_printed_settings_run_this_interpreter_and_match_the_example():
    settings = json.loads(settings_json())
    assert set(settings["hooks"]) == set(HOOK_EVENTS)
    command = settings["hooks"]["Stop"][0]["hooks"][0]["command"]
    assert command.startswith("trap '' TERM; exec ") and sys.executable in command
    example = (Path(__file__).parents[2] / "examples" / "claude_code" / "settings.json").read_text()
    assert example == settings_json("maitred hook claude-code")
    http = json.loads((Path(__file__).parents[2] / "examples" / "claude_code" / "settings.http.json").read_text())
    assert http == json.loads(settings_json("maitred hook claude-code", http="http://127.0.0.1:8000"))
    kinds = {name: groups[0]["hooks"][0]["type"] for name, groups in http["hooks"].items()}
    assert kinds.pop("SessionStart") == "command" and set(kinds.values()) == {"http"}


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ("{not json", "not JSON"),
        ('{"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash"}', "tool_use_id"),
        ("", "not JSON"),
    ],
)
def test_malformed_payload_logs_one_line_and_exits_0(tmp_path, spool_env, payload, says):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    done = hook(payload, "--foreground", env={**spool_env, "MAITRED_DB": url})
    assert done.returncode == 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith("maitred hook claude-code:")
    assert not (tmp_path / "x.db").exists()
    assert not (tmp_path / "spool").exists()


def test_runtime_down_keeps_the_events_for_the_next_delivery(spool_env):
    port = free_port()
    down = f"http://127.0.0.1:{port}"
    done = hook(json.dumps(session_payloads()[2]), "--foreground", env={**spool_env, "MAITRED_URL": down})
    assert done.returncode == 0
    [line] = done.stderr.splitlines()
    assert "1 events kept" in line and "unreachable" in line
    with EventServer(port=port) as server:  # the runtime is back: the next hook delivers both
        done = hook(json.dumps(session_payloads()[3]), "--foreground", env={**spool_env, "MAITRED_URL": down})
        assert (done.returncode, done.stderr) == (0, "")
    assert [(e["type"], e["call_id"]) for e in server.events] == [("tool.start", "toolu_01Bash1"), ("tool.end", "toolu_01Bash1")]


def test_runtime_down_falls_back_to_the_store_when_one_is_named(tmp_path, spool_env):
    url = f"sqlite:///{tmp_path / 'fallback.db'}"
    down = f"http://127.0.0.1:{free_port()}"
    done = hook(json.dumps(session_payloads()[2]), "--foreground", env={**spool_env, "MAITRED_URL": down, "MAITRED_DB": url})
    assert (done.returncode, done.stderr) == (0, "")
    assert [e["call_id"] for e in store_events(url, SESSION)] == ["toolu_01Bash1"]


def test_store_down_still_exits_0_and_keeps_the_events(spool_env):
    unreachable = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/none"
    done = hook(json.dumps(session_payloads()[2]), "--foreground", "--timeout", "1", env={**spool_env, "MAITRED_DB": unreachable})
    assert done.returncode == 0
    assert "1 events kept" in done.stderr and "the store" in done.stderr


def test_runtime_up_receives_the_events_with_the_token_and_the_program_header(spool_env):
    with EventServer() as server:
        for payload in session_payloads()[4:6]:
            done = hook(json.dumps(payload), env={**spool_env, "MAITRED_URL": server.url, "MAITRED_TOKEN": "s3cret"})
            assert (done.returncode, done.stderr) == (0, "")
        assert wait_until(lambda: len(server.events) >= 3, timeout=30)
    assert [e["type"] for e in server.events] == ["tool.start", "program.start", "handoff"]
    assert server.events[2]["child_program_id"] == CHILD
    assert set(server.auth) == {"Bearer s3cret"}
    assert {h["x-program-id"] for h in server.headers} == {SESSION}  # the subagent's events too


def test_the_hooks_fast_path_defaults_are_what_its_flags_parse_to():
    """Claude Code runs the hook without arguments, which skips argparse (a few ms a hook): the
    defaults it uses then must be the flags' own."""
    import argparse

    from maitred.integrations import claude_code_hook

    parser = argparse.ArgumentParser()
    claude_code_hook.add_arguments(parser)
    assert vars(parser.parse_args([])) == claude_code_hook._DEFAULTS


def test_print_settings_refuses_a_runtime_url_that_is_not_http(spool_env):
    done = hook("", "--print-settings", "--runtime-url", "ftp://host", env=spool_env)
    assert (done.returncode, done.stdout) == (2, "")
    assert "--runtime-url" in done.stderr and "ftp://host" in done.stderr and "Traceback" not in done.stderr
