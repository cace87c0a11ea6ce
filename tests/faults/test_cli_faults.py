"""The command line under bad input: every refusal is one stderr line naming the flag or path,
exit status 2 for usage errors and 1 for runtime errors, and nothing on disk is touched."""

import json
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
        result = subprocess.run(
            [MAITRED, "demo", "--offline", "--db-file", str(target), "--programs", "2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "2 programs" in result.stdout
    assert is_demo_database(target)
    with SessionStore(f"sqlite:///{target}") as store:
        assert len(store.programs()) == 2  # replaced, not appended to


# -- every numeric flag refuses what the command cannot use -------------------------------------

REFUSED_FLAGS = [
    (["programs", "--limit", "-1"], "--limit"),
    (["programs", "--limit", "0"], "--limit"),
    (["stats", "tools", "--since", "nan"], "--since"),
    (["stats", "tools", "--since", "inf"], "--since"),
    (["stats", "tools", "--since", "-inf"], "--since"),
    (["stats", "tools", "--since", "2099-01-01"], "--since"),
    (["programs", "--since", "4102444800"], "--since"),  # 2100-01-01 as unix seconds
    (["export", "--out", "t.jsonl", "--since", "nan"], "--since"),
    (["stats", "tools", "--db", "mysql://u@h/x"], "--db"),
    (["stats", "tools", "--db", "nonsense:x.db"], "--db"),
    (["stats", "tools", "--db", ""], "--db"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--duration", "nan"], "--duration"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--duration", "inf"], "--duration"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--duration", "0"], "--duration"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--jobs", "-2"], "--jobs"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--jobs", "0"], "--jobs"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--gpu-tokens", "0"], "--gpu-tokens"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--gpu-tokens", "1e6"], "--gpu-tokens"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--workers", "0"], "--workers"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--concurrency", "8,-1"], "--concurrency"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--cpu-ratio", "nan"], "--cpu-ratio"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--cpu-ratio", "1,inf"], "--cpu-ratio"),
    (["demo", "--programs", "-3"], "--programs"),
    (["demo", "--programs", "0"], "--programs"),
    (["demo", "--programs", "1000000"], "--programs"),
    (["programs", "--limit", str(10**20)], "--limit"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--gpu-tokens", str(10**13)], "--gpu-tokens"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--workers", "5000"], "--workers"),
    (["bench", "replay", "--trace", "synthetic", "--out", "o", "--concurrency", "10,1000000"], "--concurrency"),
]


@pytest.mark.parametrize(("argv", "flag"), REFUSED_FLAGS, ids=[" ".join(a) for a, _ in REFUSED_FLAGS])
def test_bad_flag_values_are_one_stderr_line_naming_the_flag_and_exit_2(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    line = _one_stderr_line(capsys)
    assert f"argument {flag}" in line, line
    assert list(tmp_path.iterdir()) == []  # nothing created, nothing run


# -- databases: queries never create one; a path is a database; damage is named ------------------


def _filled(path: Path) -> Path:
    _history(path)
    return path


QUERIES = [["stats", "tools"], ["programs"], ["timeline", "real-work"], ["export", "--out", "t.jsonl"]]
#: What each query prints for the one program ``_history`` records.
ANSWERS = {"stats": "grep", "programs": "programs (1 shown)", "timeline": "acting 0.30 s", "export": "wrote 1 programs"}


@pytest.mark.parametrize("query", QUERIES, ids=[q[0] for q in QUERIES])
def test_a_query_on_a_missing_database_says_so_and_creates_nothing(query, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "typo.db"
    assert main([*query, "--db", str(missing)]) == 1
    assert _one_stderr_line(capsys) == f"maitred: error: no such database: {missing}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("query", QUERIES, ids=[q[0] for q in QUERIES])
def test_db_flag_accepts_a_plain_relative_path(query, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _filled(tmp_path / "history.db")
    assert main([*query, "--db", "history.db"]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert captured.err == ""
    assert ANSWERS[query[0]] in captured.out
    if query[0] == "export":
        assert len((tmp_path / "t.jsonl").read_text().splitlines()) == 2  # header + the one program


def _corrupt(path: Path) -> None:
    """Overwrite every page after the schema page with garbage: the file still opens, and
    SQLite finds the damage as soon as it reads a table."""
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for offset in range(page, len(data), page):
        data[offset : offset + 64] = b"\xa5" * 64
    path.write_bytes(bytes(data))


def _corrupt_index(path: Path, index: str) -> None:
    """Damage one index page only: opening and migrating never read it, the integrity check does."""
    with sqlite3.connect(path) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()
        (page,) = conn.execute("PRAGMA page_size").fetchone()
    with path.open("r+b") as f:
        f.seek((root - 1) * page + 8)  # past the b-tree page header: the cell pointers and cells
        f.write(b"\xa5" * 64)


def test_db_upgrade_runs_the_integrity_check(tmp_path, capsys):
    db = _filled(tmp_path / "history.db")
    _corrupt_index(db, "ix_tool_calls_tool_ended_at")
    assert main(["db", "upgrade", "--db", str(db)]) == 1
    line = _one_stderr_line(capsys)
    assert line.startswith(f"maitred: error: {db}: integrity check:"), line
    assert "integrity check passed" not in capsys.readouterr().out


@pytest.mark.parametrize("command", [["db", "upgrade"], ["stats", "tools"], ["programs"]])
def test_a_corrupted_database_is_named_in_one_line_never_called_fine(command, tmp_path, capsys):
    db = _filled(tmp_path / "history.db")
    _corrupt(db)
    assert main([*command, "--db", str(db)]) == 1
    line = _one_stderr_line(capsys)
    assert str(db) in line and ("corrupt" in line or "integrity" in line or "malformed" in line), line
    assert "SELECT" not in line and "[SQL" not in line
    assert "integrity check passed" not in capsys.readouterr().out


def _stamp(path: Path, revision: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (revision,))


def test_a_database_from_a_newer_maitred_is_still_readable_with_a_note(tmp_path, capsys):
    db = _filled(tmp_path / "history.db")
    _stamp(db, "9999_from_the_future")
    assert main(["programs", "--db", str(db), "--json"]) == 0
    captured = capsys.readouterr()
    assert [p["program_id"] for p in json.loads(captured.out)] == ["real-work"]
    (note,) = captured.err.strip().splitlines()
    assert note.startswith("maitred: note: this database was written by a newer maitred (revision 9999_from_the_future)")
    assert main(["db", "upgrade", "--db", str(db)]) == 1
    assert "newer maitred (revision 9999_from_the_future)" in _one_stderr_line(capsys)
    with sqlite3.connect(db) as conn:  # and nobody rewrote its stamp
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("9999_from_the_future",)


def test_db_upgrade_reports_a_sound_database_as_checked(tmp_path, capsys):
    db = _filled(tmp_path / "history.db")
    assert main(["db", "upgrade", "--db", str(db)]) == 0
    assert "integrity check passed" in capsys.readouterr().out


# -- paths that cannot be opened are named -------------------------------------------------------


def test_unwritable_outputs_name_the_path(tmp_path, capsys):
    db = _filled(tmp_path / "history.db")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for argv, flag, path in (
        (["export", "--db", str(db), "--out", str(blocker / "t.jsonl")], "--out", blocker / "t.jsonl"),
        (["timeline", "real-work", "--db", str(db), "--png", str(blocker / "t.png")], "--png", blocker / "t.png"),
        (
            ["bench", "replay", "--trace", "synthetic:claude-code?programs=5", "--out", str(blocker / "bench")],
            "--out",
            blocker / "bench",
        ),
        (["demo", "--db-file", str(blocker / "demo.db"), "--programs", "1"], "--db-file", blocker / "demo.db"),
    ):
        assert main(argv) == 1, argv
        line = _one_stderr_line(capsys)
        assert line.startswith(f"maitred: error: {flag} {path}: cannot"), line
    assert blocker.read_text() == "not a folder"


def test_unreadable_inputs_name_the_path(tmp_path, capsys):
    for argv, path in (
        (["bench", "replay", "--trace", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")], tmp_path / "none.jsonl"),
        (
            ["bench", "replay", "--trace", "synthetic", "--profile", str(tmp_path / "p.json"), "--out", str(tmp_path / "o")],
            tmp_path / "p.json",
        ),
    ):
        assert main(argv) == 1
        assert str(path) in _one_stderr_line(capsys)
    assert not (tmp_path / "o").exists()


def test_a_bad_maitred_db_variable_is_named_as_such(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAITRED_DB", "oracle://scott@db/x")
    assert main(["programs"]) == 2
    assert _one_stderr_line(capsys).startswith("maitred: error: $MAITRED_DB: unsupported database 'oracle'")
    _history(tmp_path / "h.db")
    assert main(["programs", "--db", "h.db", "--json"]) == 0  # the flag wins over the variable


def test_calibrate_refuses_an_unknown_device_before_measuring(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["calibrate", "--out", str(tmp_path / "p.json"), "--device", "gpu0"]) == 2
    assert _one_stderr_line(capsys) == "maitred: error: --device 'gpu0' is not a torch device (e.g. cpu, cuda, cuda:1)"
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("query", QUERIES, ids=[q[0] for q in QUERIES])
def test_a_query_on_an_empty_database_creates_no_tables(query, db_url, tmp_path, monkeypatch, capsys):
    """On PostgreSQL the database (here: a fresh schema) exists but holds no maitred tables."""
    from sqlalchemy import create_engine, inspect

    monkeypatch.chdir(tmp_path)
    assert main([*query, "--db", db_url]) == 1
    assert _one_stderr_line(capsys).startswith("maitred: error: no such database: ")
    if db_url.startswith("sqlite"):
        assert list(tmp_path.iterdir()) == []
    else:
        engine = create_engine(db_url)
        try:
            assert inspect(engine).get_table_names() == []
        finally:
            engine.dispose()
