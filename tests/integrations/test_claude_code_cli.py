"""The real Claude Code CLI, headless, against ``maitred sim-worker --script`` on 127.0.0.1.

One scripted session exercises what the hooks must carry: Bash sleeps of known length, a failing
command, a command that hits its timeout, Read, a foreground subagent and a background one (whose
end resumes the parent through a ``<task-notification>``). It runs in store-only mode (command
hooks, ``MAITRED_DB``, no gateway) and through the gateway (``ANTHROPIC_BASE_URL`` at
``maitred serve``'s ``/v1/messages``, with the shipped http hook settings), and every event a
hook fires must be in the store: nothing lost, over repeated sessions.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from maitred.harness.background import BackgroundServer
from maitred.harness.local import local_cluster
from maitred.integrations.claude_code import child_program_id
from maitred.integrations.claude_code_hook import settings_json
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.session_script import parse_script
from maitred.storage import SessionStore
from tests.helpers import wait_until
from tests.integrations.claude_cli import Session, claude_binary, run_session

CLAUDE, WHY = claude_binary()
if CLAUDE is None:
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must run the Claude Code CLI tests: {WHY}")
    pytest.skip(f"the Claude Code CLI is not available: {WHY}", allow_module_level=True)

EXAMPLES = Path(__file__).parents[2] / "examples" / "claude_code"


def bash(command: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": "Bash", "input": {"command": command, "description": command, **extra}}]


def subagent(script: str, *, background: bool) -> list[dict[str, Any]]:
    task = {"description": f"run {script}", "prompt": f"SCRIPT:{script} go", "subagent_type": "general-purpose"}
    return [{"name": "Agent", "input": {**task, "run_in_background": background}}]


SCRIPT = parse_script(
    {
        "main": [
            bash("sleep 1"),
            bash("exit 3"),
            bash("sleep 5", timeout=1000),
            [{"name": "Read", "input": {"file_path": "/etc/hostname"}}],
            subagent("fg", background=False),
            subagent("bg", background=True),
            "main done",
        ],
        "fg": [bash("sleep 0.5"), "fg done"],
        "bg": [bash("sleep 2"), "bg done"],
    }
)
SLEEPS = {"sleep 1": 1.0, "sleep 0.5": 0.5, "sleep 2": 2.0}


@pytest.fixture
def model() -> Iterator[str]:
    """A scripted model speaking Anthropic's Messages API (the sim-worker's ``/v1/messages``)."""
    with BackgroundServer(create_app(SimWorkerConfig(script=SCRIPT, time_scale=50.0))) as server:
        yield server.url


def command_hooks(tmp_path: Path, **env: str) -> dict[str, str]:
    return {"MAITRED_SPOOL_DIR": str(tmp_path / "spool"), "MAITRED_HOOK_LINGER_S": "2", **env}


def run(tmp_path: Path, name: str, base_url: str, settings: dict[str, Any], env: dict[str, str]) -> Session:
    assert CLAUDE is not None
    session = run_session(CLAUDE, tmp_path / name, "SCRIPT:main start", base_url=base_url, settings=settings, env=env)
    assert session.returncode == 0, (session.result, session.stderr[-2000:])
    assert session.result.get("is_error") is False, session.result
    return session


def stored(db_url: str, session_id: str, *, want: int) -> list[dict[str, Any]]:
    """The session's events (its children's included) once ``want`` have been stored."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal found
        try:
            with SessionStore(db_url) as store:
                found = [e for e in store.events() if e["program_id"].startswith(session_id)]
        except Exception:  # the deliverer may still be creating the schema
            return False
        return sum(1 for e in found if not e["type"].startswith("llm.")) >= want

    wait_until(enough, timeout=60, interval=0.25)
    return found


#: What one scripted session's hooks fire, as (event type, program: main/fg/bg), in no set order.
EXPECTED = sorted(
    [("program.start", "main"), ("program.resume", "main"), ("program.resume", "main")]
    + [("tool.start", "main"), ("tool.end", "main")] * 6
    + [("program.start", c) for c in ("fg", "bg")]
    + [("handoff", "main")] * 4
    + [("tool.start", c) for c in ("fg", "bg")]
    + [("tool.end", c) for c in ("fg", "bg")]
    + [("program.end", c) for c in ("fg", "bg")]
    + [("program.wait", "main"), ("program.wait", "main"), ("program.end", "main")]
)


def check_session(db_url: str, session: Session) -> None:
    """Every event of the scripted session is stored, with the facts the tests promise."""
    sid = session.session_id
    events = [e for e in stored(db_url, sid, want=len(EXPECTED)) if not e["type"].startswith("llm.")]  # the hooks' own
    starts = {e["call_id"]: e for e in events if e["type"] == "tool.start"}
    ends = {e["call_id"]: e for e in events if e["type"] == "tool.end"}
    assert len(starts) == len(ends) == 8 and set(starts) == set(ends)
    children = {e["program_id"] for e in events if e["program_id"] != sid}
    assert len(children) == 2 and all(c.startswith(child_program_id(sid, "")) for c in children)
    # Which child ran which script: the foreground one slept 0.5 s, the background one 2 s.
    script_of = {e["program_id"]: "fg" if e["duration_s"] < 1.5 else "bg" for e in ends.values() if e["program_id"] in children}
    got = sorted((e["type"], "main" if e["program_id"] == sid else script_of[e["program_id"]]) for e in events)
    assert got == EXPECTED
    waits = sorted(e["reason"] for e in events if e["type"] == "program.wait")
    assert waits == ["background", "human"]  # Stop while the bg child runs, then the last Stop
    statuses = sorted(e["status"] for e in ends.values())
    assert statuses == ["error", "ok", "ok", "ok", "ok", "ok", "ok", "timeout"]
    [timed_out] = [c for c, e in ends.items() if e["status"] == "timeout"]
    assert (starts[timed_out]["tool"], starts[timed_out]["deadline_s"]) == ("Bash", 1.0)
    for call_id, end in ends.items():
        command = ((starts[call_id].get("signature") or ""), end["duration_s"])
        if starts[call_id]["tool"] == "Bash" and end["status"] == "ok":
            sleep = min(SLEEPS.values(), key=lambda s: abs(s - end["duration_s"]))
            assert abs(end["duration_s"] - sleep) <= 0.1 * sleep, command
    with SessionStore(db_url) as store:
        main = store.program(sid)
        assert main is not None and (main.program.framework, main.program.status) == ("claude-code", "ok")
        for child in children:
            timeline = store.program(child)
            assert timeline is not None
            assert (timeline.program.parent_program_id, timeline.program.status) == (sid, "ok")
        spans = [s for p in (sid, *children) if (t := store.program(p)) is not None for s in t.spans if s.kind == "tool"]
    assert len(spans) == 8 and all(s.end is not None and s.start <= s.end for s in spans), spans


def test_store_only_sessions_lose_nothing(model, tmp_path):
    """Command hooks without a gateway: three sessions, every hook event in the store."""
    db_url = f"sqlite:///{tmp_path / 'sessions.db'}"
    settings = json.loads(settings_json())
    for n in range(3):
        session = run(tmp_path, f"project-{n}", model, settings, command_hooks(tmp_path, MAITRED_DB=db_url))
        check_session(db_url, session)


def http_settings(gateway: str) -> dict[str, Any]:
    """The shipped http settings, pointed at this gateway, run by this interpreter."""
    text = (EXAMPLES / "settings.http.json").read_text().replace("http://127.0.0.1:8000", gateway)
    here = f"{sys.executable} -m maitred.integrations.claude_code_hook"
    return json.loads(text.replace("exec maitred hook claude-code", f"exec {here}"))


def test_through_the_gateway_one_program_one_worker_and_nothing_lost(tmp_path):
    """Claude Code's model calls through the gateway's ``/v1/messages`` and its hooks as the
    shipped http settings send them: model and tool calls under one program id, each session's
    calls on one worker, and subagents' calls on the child when only one runs."""
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    with local_cluster(workers=2, script_tools=False, db_url=db_url, time_scale=50.0, script=SCRIPT) as cluster:
        settings = http_settings(cluster.gateway_url)
        env = command_hooks(tmp_path, MAITRED_URL=cluster.gateway_url)  # SessionStart's command hook
        sessions = [run(tmp_path, f"project-{n}", cluster.gateway_url, settings, env) for n in range(2)]
        for session in sessions:
            check_session(db_url, session)
            sid = session.session_id
            with SessionStore(db_url) as store:
                main = store.program(sid)
                assert main is not None
                calls = [s for s in main.spans if s.kind == "llm"]
                assert len(calls) >= 7, [s.detail for s in calls]  # the seven turns of the main script
                assert len({s.detail["worker"] for s in calls}) == 1, [s.detail["worker"] for s in calls]
                fg = [
                    t
                    for c in {e["program_id"] for e in store.events() if e["program_id"].startswith(f"{sid}/")}
                    if (t := store.program(c)) is not None
                ]
                child_calls = [s for t in fg for s in t.spans if s.kind == "llm"]
            assert child_calls, "no subagent model call was attributed to its child program"
        health = httpx.get(f"{cluster.gateway_url}/healthz", timeout=10)
        assert health.status_code == 200
