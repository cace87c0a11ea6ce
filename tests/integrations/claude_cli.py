"""The real Claude Code CLI for the tests: installed from npm into a cache folder, run headless,
and one scripted session (``SCRIPT``, for ``maitred sim-worker --script``) with what its hooks
must leave in the store (``check_session``).

``python -m tests.integrations.claude_cli`` installs it (``.ci/run`` does, so CI runs the tests
that need it); ``claude_binary()`` finds it, installing it first when npm is there. Sessions run
with nothing leaving the machine: the model is ``AnthropicScript`` on 127.0.0.1 (or the gateway
in front of one), telemetry, the updater and other non-essential traffic are off, and ``HOME``
is a scratch folder so the user's own settings and credentials are never read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maitred.integrations.claude_code import child_program_id
from maitred.sim.worker.session_script import parse_script
from maitred.storage import SessionStore
from tests.helpers import wait_until

#: The CLI version the tests are written against (``npm view @anthropic-ai/claude-code``).
CLAUDE_CODE_VERSION = "2.1.332"
PACKAGE = f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "maitred-tests" / f"claude-code-{CLAUDE_CODE_VERSION}"


def claude_binary(install: bool = True) -> tuple[Path | None, str]:
    """(the ``claude`` executable, or None with the reason it is missing)."""
    given = os.environ.get("MAITRED_TEST_CLAUDE")
    if given:
        return (Path(given), "") if Path(given).exists() else (None, f"MAITRED_TEST_CLAUDE={given} does not exist")
    folder = cache_dir()
    binary = folder / "node_modules" / ".bin" / "claude"
    if binary.exists():
        return binary, ""
    if not install:
        return None, f"Claude Code is not installed in {folder}"
    npm = shutil.which("npm")
    if npm is None:
        return None, "npm is not installed, so the Claude Code CLI cannot be"
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder), PACKAGE],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not binary.exists():
        return None, f"npm install {PACKAGE} failed: {done.stderr.strip()[-300:]}"
    return binary, ""


@dataclass
class Session:
    """One finished headless run."""

    returncode: int
    result: dict[str, Any]
    stderr: str

    @property
    def session_id(self) -> str:
        return str(self.result.get("session_id", ""))


def run_session(
    binary: Path,
    project: Path,
    prompt: str,
    *,
    base_url: str,
    settings: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    timeout: float = 180.0,
    extra_args: tuple[str, ...] = (),
) -> Session:
    """``claude -p PROMPT`` in ``project`` with ``settings`` as its project settings."""
    (project / ".claude").mkdir(parents=True, exist_ok=True)
    (project / ".claude" / "settings.json").write_text(json.dumps(settings))
    home = project / ".home"
    home.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MAITRED_", "ANTHROPIC_", "CLAUDE_"))}
    full = {
        **clean,
        "HOME": str(home),
        "IS_SANDBOX": "1",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-test-dummy",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        **(env or {}),
    }
    done = subprocess.run(
        [str(binary), "-p", prompt, "--permission-mode", "bypassPermissions", "--output-format", "json", *extra_args],
        cwd=project,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    except ValueError:
        result = {"unparsed": done.stdout[-2000:]}
    return Session(done.returncode, result, done.stderr)


# -- one scripted session, and what its hooks must leave in the store -------------------------


def bash(command: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": "Bash", "input": {"command": command, "description": command, **extra}}]


def subagent(script: str, *, background: bool) -> list[dict[str, Any]]:
    task = {"description": f"run {script}", "prompt": f"SCRIPT:{script} go", "subagent_type": "general-purpose"}
    return [{"name": "Agent", "input": {**task, "run_in_background": background}}]


#: The session, as ``maitred sim-worker --script FILE`` reads it.
SCRIPT_TURNS: dict[str, list[Any]] = {
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
SCRIPT = parse_script(SCRIPT_TURNS)
SLEEPS = {"sleep 1": 1.0, "sleep 0.5": 0.5, "sleep 2": 2.0}


def command_hooks(tmp_path: Path, **env: str) -> dict[str, str]:
    return {"MAITRED_SPOOL_DIR": str(tmp_path / "spool"), "MAITRED_HOOK_LINGER_S": "2", **env}


def run(
    binary: Path, tmp_path: Path, name: str, base_url: str, settings: dict[str, Any], env: dict[str, str], *extra: str
) -> Session:
    """One headless run of the scripted session; it must end without an error."""
    session = run_session(
        binary, tmp_path / name, "SCRIPT:main start", base_url=base_url, settings=settings, env=env, extra_args=extra
    )
    assert session.returncode == 0, (session.result, session.stderr[-2000:])
    assert session.result.get("is_error") is False, session.result
    return session


def stored_session(db_url: str, session_id: str, *, want: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The session's events (its children's included) once ``want`` hook events have been stored
    (or what is there after ``timeout``)."""
    found: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal found
        try:
            with SessionStore(db_url) as store:
                found = [e for e in store.events() if e["program_id"].startswith(session_id)]
        except Exception:  # the deliverer may still be creating the schema
            return False
        return sum(1 for e in found if not e["type"].startswith("llm.")) >= want

    wait_until(enough, timeout=timeout, interval=0.25)
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
    events = [e for e in stored_session(db_url, sid, want=len(EXPECTED)) if not e["type"].startswith("llm.")]  # the hooks' own
    starts = {e["call_id"]: e for e in events if e["type"] == "tool.start"}
    ends = {e["call_id"]: e for e in events if e["type"] == "tool.end"}
    assert len(starts) == len(ends) == 8 and set(starts) == set(ends)
    children = {e["program_id"] for e in events if e["program_id"] != sid}
    assert len(children) == 2 and all(c.startswith(child_program_id(sid, "")) for c in children)
    # Which child ran which script: the foreground one slept 0.5 s, the background one 2 s.
    # The shorter of the two children's calls is the foreground one (no fixed cut: load stretches both).
    by_length = sorted((e["duration_s"], e["program_id"]) for e in ends.values() if e["program_id"] in children)
    assert len(by_length) == 2, by_length
    script_of = {by_length[0][1]: "fg", by_length[1][1]: "bg"}
    got = sorted((e["type"], "main" if e["program_id"] == sid else script_of[e["program_id"]]) for e in events)
    missing, extra = Counter(EXPECTED) - Counter(got), Counter(got) - Counter(EXPECTED)
    assert got == EXPECTED, (f"missing {sorted(missing.elements())}, unexpected {sorted(extra.elements())}", by_length)
    waits = sorted(e["reason"] for e in events if e["type"] == "program.wait")
    assert waits == ["background", "human"]  # Stop while the bg child runs, then the last Stop
    statuses = sorted(e["status"] for e in ends.values())
    assert statuses == ["error", "ok", "ok", "ok", "ok", "ok", "ok", "timeout"]
    [timed_out] = [c for c, e in ends.items() if e["status"] == "timeout"]
    assert (starts[timed_out]["tool"], starts[timed_out]["deadline_s"]) == ("Bash", 1.0)
    # The durations are Claude Code's own (duration_ms), not the hooks' arrival times, which race:
    # each sleep's call lasts at least its sleep, in the sleeps' order. No upper bound: a loaded
    # machine stretches a 1 s sleep past 1.2 s.
    slept = sorted(e["duration_s"] for c, e in ends.items() if starts[c]["tool"] == "Bash" and e["status"] == "ok")
    assert len(slept) == len(SLEEPS)
    for duration, sleep in zip(slept, sorted(SLEEPS.values()), strict=True):
        assert duration >= sleep, (slept, sorted(SLEEPS.values()))
    with SessionStore(db_url) as store:
        main = store.program(sid)
        assert main is not None and (main.program.framework, main.program.status) == ("claude-code", "ok")
        for child in children:
            timeline = store.program(child)
            assert timeline is not None
            assert (timeline.program.parent_program_id, timeline.program.status) == (sid, "ok")
        spans = [s for p in (sid, *children) if (t := store.program(p)) is not None for s in t.spans if s.kind == "tool"]
    assert len(spans) == 8 and all(s.end is not None and s.start <= s.end for s in spans), spans


if __name__ == "__main__":
    found, why = claude_binary()
    print(found if found else f"not installed: {why}")
    sys.exit(0 if found else 1)
