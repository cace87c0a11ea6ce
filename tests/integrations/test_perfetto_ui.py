"""A timeline written by ``maitred timeline --perfetto`` opens in the real Perfetto UI (served on
127.0.0.1, read in headless Chromium): its program and agent tracks are drawn and the UI reports
no error. The same check on a file the UI cannot read shows the UI's error, so the check can fail.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integrations.browser import Page, browser, require_chromium
from tests.integrations.perfetto_ui import perfetto_ui, perfetto_ui_venv

UI_ERROR = "Oops, something went wrong"


def _maitred(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "maitred", *args], check=True, capture_output=True, timeout=300)


def _read(venv: Path, trace: Path, expect: str) -> str:
    """The UI's text once it shows ``expect`` or its error (tracks are drawn after the trace loads)."""

    async def read(page: Page) -> str:
        return await page.wait_for(lambda text: expect in text or UI_ERROR in text, timeout_s=90)

    with perfetto_ui(venv, trace) as url, browser() as visit:
        return str(visit(url, read))


@pytest.fixture(scope="module")
def venv(pytestconfig: pytest.Config) -> Path:
    require_chromium()
    return perfetto_ui_venv(pytestconfig)


def test_a_stored_program_opens_in_the_perfetto_ui(venv: Path, tmp_path: Path) -> None:
    db, trace = tmp_path / "demo.db", tmp_path / "demo-0.json"
    _maitred("demo", "--offline", "--db-file", str(db))
    _maitred("timeline", "demo-0", "--db", str(db), "--perfetto", str(trace))
    threads = {e["args"]["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "thread_name"}
    assert threads
    text = _read(venv, trace, "program demo-0")
    assert UI_ERROR not in text
    assert "program demo-0" in text  # the process track
    for thread in threads:  # every program/agent track the file names is drawn
        assert thread in text, (thread, text[:500])


def test_a_file_the_ui_cannot_read_shows_its_error(venv: Path, tmp_path: Path) -> None:
    trace = tmp_path / "bad.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": "soon", "dur": -5, "pid": "q"}, 7]}))
    assert UI_ERROR in _read(venv, trace, "program ")
