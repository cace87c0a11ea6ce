"""The command line under bad input: every refusal is one stderr line naming the flag or path,
exit status 2 for usage errors and 1 for runtime errors, and nothing on disk is touched."""

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from maitred.cli import main
from maitred.demo import is_demo_database
from maitred.events import decode_batch
from maitred.storage import SessionStore
from tests.test_store import T0, tool_events

MAITRED = str(Path(sys.executable).with_name("maitred"))


def _one_stderr_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


# -- demo --db-file never deletes a history it did not make -------------------------------------

def _history(path: Path) -> str:
    url = f"sqlite:///{path}"
    with SessionStore(url) as store:
        store.write(decode_batch(tool_events("real-work", "grep", [0.1, 0.2]), now=T0 + 10).events)
    return url


def _tool_calls(url: str) -> int:
    with SessionStore(url) as store:
        return sum(p.tool_calls for p in store.programs())


@pytest.mark.parametrize("kind", ["maitred history", "other sqlite", "text file", "empty file"])
def test_demo_refuses_to_overwrite_what_it_did_not_make(kind, tmp_path, capsys):
    target = tmp_path / "precious.db"
    if kind == "maitred history":
        _history(target)
    elif kind == "other sqlite":
        with sqlite3.connect(target) as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
    elif kind == "text file":
        target.write_text("my notes\n")
    else:
        target.touch()
    before = target.read_bytes()

    assert main(["demo", "--db-file", str(target), "--programs", "1"]) == 2
    line = _one_stderr_line(capsys)
    assert "--db-file" in line and str(target) in line and "not a maitred demo database" in line
    assert target.read_bytes() == before
    if kind == "maitred history":
        assert _tool_calls(f"sqlite:///{target}") == 2


def test_demo_refuses_a_directory(tmp_path, capsys):
    assert main(["demo", "--db-file", str(tmp_path), "--programs", "1"]) == 2
    assert str(tmp_path) in _one_stderr_line(capsys)
    assert tmp_path.is_dir()


def test_demo_reruns_over_its_own_database(tmp_path):
    target = tmp_path / "demo.db"
    for _ in range(2):
        result = subprocess.run([MAITRED, "demo", "--db-file", str(target), "--programs", "2"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "2 programs" in result.stdout
    assert is_demo_database(target)
    with SessionStore(f"sqlite:///{target}") as store:
        assert len(store.programs()) == 2  # replaced, not appended to
