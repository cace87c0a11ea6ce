"""Separate venvs for the servers the integration tests start (a LiteLLM proxy, Arize Phoenix):
what they install must neither come from nor go into the project's ``dev`` environment.

Each is built once into pytest's cache (``.pytest_cache``; with the cache plugin off, the user's
cache folder; called without one, from a script such as ``docs/screenshots.py``, the same),
keyed by what it installs and the Python version, and skipped with one line where it cannot be
built (no package index), except in CI, where that is a failure; a script gets a RuntimeError.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest


def _root(pytestconfig: pytest.Config | None) -> Path:
    cache = getattr(pytestconfig, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("venvs"))
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "maitred-test-venvs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cached_venv(
    pytestconfig: pytest.Config | None,
    name: str,
    install: list[str],
    *,
    key: bytes,
    what: str,
    then: Sequence[list[str]] = (),
) -> Path:
    """A venv with ``pip install *install``, then ``pip install *step`` for each of ``then`` (a
    package installed ``--no-deps`` after the rest); ``key`` is what, changed, needs a new one
    (``pyproject.toml``, a pinned version); ``what`` names it in the skip line."""
    digest = hashlib.sha256(key + sys.version.encode()).hexdigest()[:12]
    folder = _root(pytestconfig) / f"{name}-{digest}"
    venv, ready = folder / "venv", folder / "ready"
    if ready.exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for step in ([sys.executable, "-m", "venv", str(venv)], [*pip, *install], *([*pip, *more] for more in then)):
        done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[-1]
            message = f"a venv with {what} could not be built ({last})"
            if pytestconfig is None:
                raise RuntimeError(message)
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
    ready.write_text(digest)
    return venv


def stop_server(process: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """Stop a server started from one of these venvs: SIGTERM, then SIGKILL after ``grace_s``."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
