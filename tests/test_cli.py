import json
import subprocess
import sys
from pathlib import Path

import pytest

from maitred.cli import main
from maitred.events import decode_batch
from maitred.storage import SessionStore
from tests.test_store import T0, tool_events


@pytest.fixture
def filled(db_url):
    with SessionStore(db_url) as store:
        raw = [
            {"type": "program.start", "ts": T0, "program_id": "p-1", "agent": "planner"},
            {"type": "llm.start", "ts": T0, "program_id": "p-1", "request_id": "r"},
            {
                "type": "llm.end",
                "ts": T0 + 1,
                "program_id": "p-1",
                "request_id": "r",
                "prompt_tokens": 10,
                "completion_tokens": 2,
            },
            *tool_events("p-1", "grep", [0.1, 0.3, 0.2], start=T0 + 1),
            {"type": "handoff", "ts": T0 + 3, "program_id": "p-1", "from_agent": "planner", "to_agent": "coder"},
            {"type": "program.end", "ts": T0 + 4, "program_id": "p-1"},
        ]
        store.write(decode_batch(raw, now=T0 + 10).events)
    return db_url


def test_version_is_maitred_dunder_version_and_written_once(capsys):
    """``maitred --version`` prints ``maitred.__version__``, which is also what the package is
    built with: pyproject.toml names no version of its own."""
    import tomllib

    import maitred

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{maitred.__version__}\n"
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "maitred.__version__"}


def test_stats_tools_json_is_one_document(filled, capsys):
    assert main(["stats", "tools", "--db", filled, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["tool"], r["n"]) for r in rows] == [("grep", 3), ("*", 3)]
    assert rows[0]["p50_s"] == pytest.approx(0.2)


def test_stats_tools_table_and_single_tool(filled, capsys):
    assert main(["stats", "tools", "--db", filled, "--tool", "grep"]) == 0
    out = capsys.readouterr().out
    assert "grep" in out and "200.0ms" in out
    assert main(["stats", "tools", "--db", filled, "--tool", "nope"]) == 0
    assert "no completed tool calls for tool 'nope'" in capsys.readouterr().out


def test_programs_and_timeline(filled, capsys, tmp_path):
    assert main(["programs", "--db", filled, "--json"]) == 0
    (program,) = json.loads(capsys.readouterr().out)
    assert (program["program_id"], program["tool_calls"], program["llm_calls"]) == ("p-1", 3, 1)
    png = tmp_path / "timeline.png"
    assert main(["timeline", "p-1", "--db", filled, "--png", str(png), "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{") :])
    assert doc["totals"]["acting_s"] == pytest.approx(0.6) and len(doc["handoffs"]) == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert main(["timeline", "missing", "--db", filled]) == 1
    assert "no program 'missing'" in capsys.readouterr().err


def test_piped_tables_are_not_cut_to_80_columns(tmp_path):
    """``maitred programs | less``: rich sizes output to 80 columns when stdout is not a
    terminal, which cut a long program id short; piped output now has room for it, and an id
    longer than any width folds onto a second line instead of losing its end."""
    import os

    from maitred.events import ProgramStart

    url = f"sqlite:///{tmp_path / 'wide.db'}"
    long_id = "swe-bench-django__django-11099-attempt-3-" + "x" * 19
    with SessionStore(url) as store:
        store.write([ProgramStart(ts=T0, program_id=long_id, agent="a-rather-long-agent-name-for-a-table")])
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run(
        [sys.executable, "-m", "maitred", "programs", "--db", url], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert long_id in piped and "a-rather-long-agent-name-for-a-table" in piped and "…" not in piped
    narrow = subprocess.run(
        [sys.executable, "-m", "maitred", "programs", "--db", url],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "80"},
        check=True,
    ).stdout
    assert "…" not in narrow and long_id[:5] in narrow and long_id.count("x") <= narrow.count("x")


def test_export_and_db_upgrade(filled, capsys, tmp_path):
    assert main(["db", "upgrade", "--db", filled]) == 0
    assert "integrity check passed" in capsys.readouterr().out
    out = tmp_path / "t.jsonl"
    assert main(["export", "--db", filled, "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2


def test_bad_flag_value_names_the_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["stats", "tools", "--since", "yesterday-ish"])
    assert info.value.code == 2
    assert "--since" in capsys.readouterr().err


def test_unreachable_database_is_one_line_not_a_traceback(capsys):
    from tests.helpers import free_port

    port = free_port()
    assert main(["stats", "tools", "--db", f"postgresql://postgres@127.0.0.1:{port}/x"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("maitred: error: database unavailable") and f"127.0.0.1:{port}/x" in captured.err


def test_offline_demo_runs_end_to_end(tmp_path):
    exe = Path(sys.executable).with_name("maitred")
    result = subprocess.run(
        [str(exe), "demo", "--offline", "--programs", "3"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "(all)" in result.stdout and "3 programs" in result.stdout
    with SessionStore(f"sqlite:///{tmp_path / 'maitred-demo.db'}") as store:
        assert {r.tool for r in store.tool_stats_all()} >= {"grep", "read_file", "bash", "*"}
        assert all(p.status == "ok" for p in store.programs())


def test_live_demo_compares_maitred_with_round_robin_through_the_gateway(tmp_path):
    """`make demo`: two simulated workers behind `maitred serve`, the same programs under both
    policies; every request answered, the history stored, the figure written."""
    exe = Path(sys.executable).with_name("maitred")
    result = subprocess.run(
        [str(exe), "demo", "--programs", "3", "--steps", "2"], cwd=tmp_path, capture_output=True, text=True, timeout=280
    )
    assert result.returncode == 0, result.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in result.stdout.splitlines() if line.startswith("│ ")]
    policy_rows = {row[0][:7]: row for row in rows if row[0].startswith(("maitred", "round_r"))}
    assert set(policy_rows) == {"maitred", "round_r"}
    for policy, requests, errors, *_ in policy_rows.values():
        assert int(requests) == 3 * 2 and errors == "0", policy
    assert (tmp_path / "maitred-demo.png").stat().st_size > 0
    with SessionStore(f"sqlite:///{tmp_path / 'maitred-demo.db'}", create=False) as store:
        programs = {p.program_id for p in store.programs()}
    assert {"maitred-0", "round_robin-0"} <= programs
