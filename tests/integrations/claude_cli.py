"""The real Claude Code CLI for the tests: installed from npm into a cache folder, run headless.

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


if __name__ == "__main__":
    found, why = claude_binary()
    print(found if found else f"not installed: {why}")
    sys.exit(0 if found else 1)
