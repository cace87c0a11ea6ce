"""The commands that live with the runtime service and the integrations, reached through the
``maitred`` entry point (``maitred/__main__.py``) as users run them."""

import argparse
import json
import subprocess
import sys

import pytest

MAITRED = [sys.executable, "-m", "maitred"]


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*MAITRED, *args], input=stdin, capture_output=True, timeout=120)


def test_help_lists_the_plugged_commands() -> None:
    out = run("--help").stdout.decode()
    for name in ("serve", "sglang-args", "sim-worker", "hook"):
        assert f"\n    {name}" in out


@pytest.mark.parametrize(
    "argv", [["serve", "--port", "0"], ["sim-worker", "--gpu-tokens", "-5"], ["serve", "--worker", "ftp://x"]]
)
def test_bad_flags_are_one_line_naming_the_flag(argv: list[str]) -> None:
    result = run(*argv)
    assert result.returncode == 2
    err = result.stderr.decode().strip()
    assert "\n" not in err and argv[1] in err


def test_sglang_args_prints_one_launch_line_per_gpu_and_the_serve_line() -> None:
    result = run("sglang-args", "/models/m", "--gpus", "0,1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=1"]
    assert all("--radix-eviction-policy priority" in line for line in lines[:2])
    assert lines[2].startswith("maitred serve") and lines[2].count("--worker") == 2


def test_claude_code_hook_skips_the_full_cli(tmp_path) -> None:
    """The hook path must not import maitred.cli (rich, SQLAlchemy, the simulator): it runs on
    every tool call. Measured as the modules loaded, not as time."""
    probe = (
        "import io, sys; sys.stdin = io.TextIOWrapper(io.BytesIO(b'{not json'));"
        "from maitred.__main__ import main; rc = main(['hook', 'claude-code', '--foreground']);"
        "print(rc, 'maitred.cli' in sys.modules, 'sqlalchemy' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120, cwd=tmp_path)
    assert result.stdout.decode().split() == ["0", "False", "False"], result.stderr
    assert b"not JSON" in result.stderr


def test_claude_code_hook_records_a_payload_through_the_entry_point(tmp_path) -> None:
    db = tmp_path / "hooks.db"
    payload = {
        "session_id": "s-1",
        "hook_event_name": "SessionStart",
        "source": "startup",
        "transcript_path": str(tmp_path / "t.jsonl"),
        "cwd": str(tmp_path),
    }
    result = run("hook", "claude-code", "--foreground", "--db", f"sqlite:///{db}", stdin=json.dumps(payload).encode())
    assert result.returncode == 0, result.stderr
    from maitred.storage import SessionStore

    with SessionStore(f"sqlite:///{db}", create=False) as store:
        assert [p.program_id for p in store.programs()] == ["s-1"]


@pytest.mark.parametrize("command", [["sim-worker"], ["serve", "--worker", "http://127.0.0.1:9"]])
def test_a_taken_port_is_one_line_and_exit_1(command: list[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(*command, "--port", str(port))
    assert result.returncode == 1
    err = result.stderr.decode().strip()
    assert "\n" not in err and f"--port {port}" in err


def test_sim_worker_profile_is_a_file_or_a_built_in_name() -> None:
    from maitred.sim.worker.server import add_arguments
    from maitred.sim.worker.server import run as run_sim_worker

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match=r"--profile: engine profile missing\.json"):
        run_sim_worker(parser.parse_args(["--profile", "missing.json"]))
    with pytest.raises(ValueError, match="--host 256.1.1.1"):  # the built-in name passed; the address did not
        run_sim_worker(parser.parse_args(["--profile", "h200-7b", "--host", "256.1.1.1"]))
