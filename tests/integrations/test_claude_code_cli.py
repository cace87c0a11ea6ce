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
from maitred.integrations.claude_code_hook import settings_json
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from maitred.storage import SessionStore
from tests.integrations.claude_cli import SCRIPT, check_session, claude_binary, command_hooks, run

CLAUDE, WHY = claude_binary()
if CLAUDE is None:
    if os.environ.get("CI"):
        raise RuntimeError(f"CI must run the Claude Code CLI tests: {WHY}")
    pytest.skip(f"the Claude Code CLI is not available: {WHY}", allow_module_level=True)
assert CLAUDE is not None
BINARY: Path = CLAUDE

EXAMPLES = Path(__file__).parents[2] / "examples" / "claude_code"


@pytest.fixture
def model() -> Iterator[str]:
    """A scripted model speaking Anthropic's Messages API (the sim-worker's ``/v1/messages``)."""
    with BackgroundServer(create_app(SimWorkerConfig(script=SCRIPT, time_scale=50.0))) as server:
        yield server.url


def test_store_only_sessions_lose_nothing(model, tmp_path):
    """Command hooks without a gateway: three sessions, every hook event in the store."""
    db_url = f"sqlite:///{tmp_path / 'sessions.db'}"
    settings = json.loads(settings_json())
    for n in range(3):
        session = run(BINARY, tmp_path, f"project-{n}", model, settings, command_hooks(tmp_path, MAITRED_DB=db_url))
        check_session(db_url, session)


def http_settings(gateway: str) -> dict[str, Any]:
    """The shipped http settings, pointed at this gateway, run by this interpreter."""
    text = (EXAMPLES / "settings.http.json").read_text().replace("http://127.0.0.1:8000", gateway)
    here = f"{sys.executable} -m maitred.integrations.claude_code_hook"
    return json.loads(text.replace("exec maitred hook claude-code", f"exec {here}"))


def test_through_the_gateway_one_program_one_worker_and_nothing_lost(tmp_path):
    """Claude Code's model calls through the gateway's ``/v1/messages`` and its hooks as the
    shipped http settings send them: model and tool calls under one program id, each session's
    calls on one worker, and subagents' calls on their child programs."""
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    with local_cluster(workers=2, script_tools=False, db_url=db_url, time_scale=50.0, script=SCRIPT) as cluster:
        settings = http_settings(cluster.gateway_url)
        env = command_hooks(tmp_path, MAITRED_URL=cluster.gateway_url)  # SessionStart's command hook
        sessions = [run(BINARY, tmp_path, f"project-{n}", cluster.gateway_url, settings, env) for n in range(2)]
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
            # Both subagents' calls (two turns each) are their own: Claude Code names the subagent.
            assert len(fg) == 2 and all(len([s for s in t.spans if s.kind == "llm"]) == 2 for t in fg), child_calls
        health = httpx.get(f"{cluster.gateway_url}/healthz", timeout=10)
        assert health.status_code == 200
