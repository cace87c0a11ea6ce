"""Feed a recorded Claude Code session, hook by hook, to maitred the way Claude Code would.

Each payload is piped into the command hook (``python -m maitred.integrations.claude_code_hook``, what
``maitred hook claude-code`` runs), one process per hook as Claude Code runs them, with
``MAITRED_URL`` pointing at the gateway. The runtime's view of the session is printed after a
few of them: the open tool call with its signature and deadline, the subagent's child program,
the wait on the human after ``Stop``. With ``--http`` the payloads are posted to the gateway's
``/v1/hooks/claude-code`` instead, as an ``http`` hook does.

    python examples/claude_code/replay_session.py                  # starts two sim-workers and a gateway here
    python examples/claude_code/replay_session.py --gateway http://127.0.0.1:8000
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from maitred.harness.local import local_cluster

SESSION = Path(__file__).parents[2] / "tests" / "integrations" / "fixtures" / "claude_code" / "session.jsonl"
SHOW_AFTER = {"PreToolUse", "SubagentStart", "Stop", "UserPromptSubmit"}


def show(gateway: str, session_id: str) -> None:
    for program in httpx.get(f"{gateway}/v1/programs", timeout=10).json():
        if program["program_id"].startswith(session_id):
            tool = program["tool"] or {}
            print(
                f"    {program['program_id'][-24:]:>24}  phase={program['phase']:<13} tool={tool.get('signature') or tool.get('tool')}"
                f"  worker={program['worker']}"
            )


def replay(gateway: str, path: Path, http: bool) -> None:
    env = {**os.environ, "MAITRED_URL": gateway}
    for line in path.read_text().splitlines():
        payload = json.loads(line)
        name = payload["hook_event_name"]
        if http:
            httpx.post(f"{gateway}/v1/hooks/claude-code", json=payload, timeout=10).raise_for_status()
        else:
            # --foreground: each hook delivers before it exits, so the view below already shows it
            # (Claude Code's hooks leave that to the background deliverer).
            hook = [sys.executable, "-m", "maitred.integrations.claude_code_hook", "--foreground"]
            subprocess.run(hook, input=line, text=True, env=env, check=True)
        detail = payload.get("tool_name") or payload.get("agent_type") or payload.get("source") or ""
        print(f"{name:<20} {detail}")
        if name in SHOW_AFTER:
            show(gateway, payload["session_id"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", help="URL of a running maitred serve (default: start one here on two sim-workers)")
    parser.add_argument(
        "--session", type=Path, default=SESSION, help="hook payloads, one JSON object a line (default: a sample session)"
    )
    parser.add_argument("--http", action="store_true", help="post to /v1/hooks/claude-code like an http hook instead")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        gateway = args.gateway
        if gateway is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            gateway = stack.enter_context(local_cluster(db_url=f"sqlite:///{folder}/maitred.db", script_tools=False)).gateway_url
        replay(gateway.rstrip("/"), args.session, args.http)


if __name__ == "__main__":
    main()
