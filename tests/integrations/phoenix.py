"""Arize Phoenix on 127.0.0.1, as a real OTLP/HTTP receiver whose REST API reads the spans back.

Phoenix is about 850 MB of dependencies, so it runs from a venv of its own (``venvs.py``), never
from the project's; ``MAITRED_TEST_PHOENIX_VENV`` names one already built (CI caches it), else
it is built once. Its SQLite database lives in the test's folder; nothing leaves the machine
(its telemetry is off). Its gRPC receiver, which cannot be turned off, binds a free port too.
"""

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from maitred.bind import wait_http
from maitred.harness.background import free_port
from tests.integrations.venvs import cached_venv, stop_server

PHOENIX = "arize-phoenix==20.26.1"


@dataclass
class Phoenix:
    url: str

    def spans(self, project: str = "default") -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/v1/projects/{project}/spans", params={"limit": 1000}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]

    def wait_for_spans(self, count: int, *, trace_id: str | None = None, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The spans (of ``trace_id``, if given) once there are ``count``; Phoenix stores what it
        receives in batches, a moment later."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = [s for s in self.spans() if trace_id is None or s["context"]["trace_id"] == trace_id]
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.2)


def phoenix_venv(pytestconfig: pytest.Config | None = None) -> Path:
    """``MAITRED_TEST_PHOENIX_VENV`` if set (checked for the pinned version), else the cached one."""
    given = os.environ.get("MAITRED_TEST_PHOENIX_VENV")
    if not given:
        return cached_venv(pytestconfig, "phoenix", [PHOENIX], key=PHOENIX.encode(), what=PHOENIX)
    version = PHOENIX.split("==")[1]
    python = Path(given) / "bin" / "python"
    check = "import importlib.metadata as m; print(m.version('arize-phoenix'))"
    found = subprocess.run([str(python), "-c", check], capture_output=True, text=True, timeout=60).stdout.strip()
    if found != version:
        raise RuntimeError(f"MAITRED_TEST_PHOENIX_VENV={given}: has arize-phoenix {found or 'not installed'}, expected {version}")
    return Path(given)


@contextmanager
def run_phoenix(venv: Path, folder: Path) -> Iterator[Phoenix]:
    """Phoenix serving from ``venv`` on free ports of 127.0.0.1, its database and log in ``folder``;
    stopped on exit. The tests' fixture and ``docs/screenshots.py`` both start it here."""
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_WORKING_DIR": str(folder),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    with ExitStack() as stack, open(folder / "phoenix.log", "w") as log:
        process = subprocess.Popen([str(venv / "bin" / "phoenix"), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
        stack.callback(stop_server, process)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/healthz", timeout_s=180, process=process)
        except (RuntimeError, TimeoutError) as exc:
            tail = "".join((folder / "phoenix.log").read_text(errors="replace").splitlines(keepends=True)[-30:])
            raise RuntimeError(f"{exc}\n--- the end of phoenix.log ---\n{tail}") from None
        yield Phoenix(url)


@pytest.fixture(scope="module", name="phoenix")
def phoenix_server(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    try:
        venv = phoenix_venv(pytestconfig)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    with run_phoenix(venv, tmp_path_factory.mktemp("phoenix")) as phoenix:
        yield phoenix
