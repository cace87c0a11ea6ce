"""``maitred serve`` on the command line, and co-located SGLang with a stand-in executable.

The stand-in is a tiny script given as ``--sglang-python``: it records the command line and
environment it was started with, then becomes a simulated worker on the port it was given, so
the whole lifecycle (start, health, routing, stop, death of the parent) runs without sglang."""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from maitred.gateway.serve import POLICY_NAMES
from maitred.gateway.sglang.launch import REQUIRED_FLAGS, ChildServers, SGLangLaunch
from maitred.harness.background import free_port, wait_http
from maitred.runtime.policies import POLICIES

STANDIN = """#!{python}
import json, os, sys
args = sys.argv[1:]
assert args[:2] == ["-m", "sglang.launch_server"], args
with open(os.path.join(os.environ["STANDIN_RECORDS"], str(os.getpid())), "w") as f:
    json.dump({{"argv": args, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "pgid": os.getpgid(0)}}, f)
port = args[args.index("--port") + 1]
os.execv(sys.executable, [sys.executable, "-m", "maitred.sim.worker", "--port", port, "--gpu-tokens", "50000"])
"""


@pytest.fixture
def standin(tmp_path, monkeypatch) -> Path:
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("STANDIN_RECORDS", str(records))
    script = tmp_path / "fake-python"
    script.write_text(STANDIN.format(python=sys.executable))
    script.chmod(0o755)
    return script


def two_free_ports() -> int:
    """A port whose successor is free too (the servers take consecutive ports)."""
    for _ in range(50):
        base = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise RuntimeError("no two consecutive free ports")


def records(standin: Path) -> list[dict]:
    folder = standin.parent / "records"
    return [dict(json.loads(p.read_text()), pid=int(p.name)) for p in folder.iterdir()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


def test_launch_line_carries_the_flags_maitred_relies_on():
    launch = SGLangLaunch("/models/qwen", ("0", "3"), base_port=31000, hicache_ratio=2.5, extra_args=("--tp-size", "1"))
    specs = launch.specs()
    assert [s.port for s in specs] == [31000, 31001] and [s.env for s in specs] == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "3"},
    ]
    argv = specs[1].argv
    assert argv[1:5] == ("-m", "sglang.launch_server", "--model-path", "/models/qwen")
    for flag in REQUIRED_FLAGS:
        assert flag in argv
    assert argv[argv.index("--hicache-ratio") + 1] == "2.5" and argv[-2:] == ("--tp-size", "1")
    assert argv[argv.index("--hicache-write-policy") + 1] == "write_through"  # from 2 GPUs of host memory on
    assert "--enable-priority-scheduling" not in argv
    assert specs[0].shell_line().startswith("CUDA_VISIBLE_DEVICES=0 ")
    assert launch.urls() == ["http://127.0.0.1:31000", "http://127.0.0.1:31001"]
    for bad, flag in [
        (dict(gpus=()), "--gpus"),
        (dict(gpus=("0", "0")), "--gpus"),
        (dict(hicache_ratio=1.0), "--hicache-ratio"),
        (dict(base_port=65535), "--sglang-base-port"),
    ]:
        with pytest.raises(ValueError, match=flag):
            SGLangLaunch("/m", **{"gpus": ("0",), **bad})


@pytest.mark.parametrize(
    ("ratio", "policy"),
    [(1.01, "write_back"), (1.5, "write_back"), (1.99, "write_back"), (2, "write_through"), (4, "write_through")],
)
def test_a_host_pool_under_twice_the_gpu_is_written_back(ratio, policy):
    """maitred.runtime.hicache's rule: write-back makes a small host pool add to the GPU's
    instead of mirroring it; from 2 GPUs of host memory on, write-through costs less."""
    argv = SGLangLaunch("/models/qwen", ("0",), hicache_ratio=ratio).specs()[0].argv
    assert argv[argv.index("--hicache-write-policy") + 1] == policy


def test_child_servers_start_healthy_and_stop_with_their_process_groups(standin):
    launch = SGLangLaunch("/models/m", ("0", "1"), base_port=two_free_ports(), python=str(standin))
    children = ChildServers(launch, startup_timeout_s=60)
    urls = children.start()
    try:
        for url in urls:
            assert httpx.get(url + "/health").status_code == 200
        seen = records(standin)
        assert sorted(r["gpu"] for r in seen) == ["0", "1"]
        assert all(r["pgid"] == r["pid"] for r in seen), "each server leads its own process group"
        assert all("--radix-eviction-policy" in r["argv"] for r in seen)
    finally:
        children.stop()
    wait_gone([r["pid"] for r in seen])


def _serve(args: list[str], **kwargs) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "maitred.gateway.serve", *args], **kwargs)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_serve_launches_sglang_routes_to_it_and_takes_it_down_with_itself(standin, how):
    port, base = free_port(), two_free_ports()
    serve = _serve(
        [
            "--launch-sglang",
            "/models/m",
            "--gpus",
            "0,1",
            "--sglang-python",
            str(standin),
            "--sglang-base-port",
            str(base),
            "--port",
            str(port),
            "--no-db",
            "--tick",
            "0.2",
            "--log-level",
            "warning",
        ]
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=90, process=serve)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
        assert sorted(health["workers"]) == [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=30,
            json={"model": "m", "program_id": "p", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert r.status_code == 200
        children = [r["pid"] for r in records(standin)]
        assert len(children) == 2 and all(alive(pid) for pid in children)
        serve.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        code = serve.wait(30)
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it: the exit status says so.
        assert code in ((0, -signal.SIGTERM) if how == "sigterm" else (-signal.SIGKILL,))
        wait_gone(children)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--worker", "ftp://host:1"], "--worker"),
        (["--worker", "http://h:99999"], "--worker"),
        (["--port", "0", "--worker", "http://127.0.0.1:1"], "--port"),
        (["--policy", "fifo", "--worker", "http://127.0.0.1:1"], "--policy"),
        (["--tick", "nan", "--worker", "http://127.0.0.1:1"], "--tick"),
        (["--hold-timeout", "-1", "--worker", "http://127.0.0.1:1"], "--hold-timeout"),
        (["--program-ttl", "0", "--worker", "http://127.0.0.1:1"], "--program-ttl"),
        (["--busy-margin", "0", "--worker", "http://127.0.0.1:1"], "--busy-margin"),
        (["--busy-margin", "1.5", "--worker", "http://127.0.0.1:1"], "--busy-margin"),
        (["--overcommit-headroom", "-0.1", "--worker", "http://127.0.0.1:1"], "--overcommit-headroom"),
        (["--policy", "mori", "--overcommit-headroom", "0", "--worker", "http://127.0.0.1:1"], "--overcommit-headroom"),
        (["--gpus", "0,0", "--launch-sglang", "/m"], "--gpus"),
        (["--hicache-ratio", "1", "--launch-sglang", "/m"], "--hicache-ratio"),
        (["--host", "0.0.0.0", "--worker", "http://127.0.0.1:1"], "--host"),
        (["--no-db", "--db", "sqlite:///x.db", "--worker", "http://127.0.0.1:1"], "--no-db"),
    ],
)
def test_serve_refuses_bad_flags_naming_the_flag(argv, flag, monkeypatch):
    monkeypatch.delenv("MAITRED_TOKEN", raising=False)
    result = subprocess.run([sys.executable, "-m", "maitred.gateway.serve", *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr and "Traceback" not in result.stderr


def test_sglang_args_prints_the_launch_lines_and_the_serve_line():
    code = (
        "import argparse, sys; from maitred.gateway.serve import add_sglang_args_arguments, run_sglang_args; "
        "p = argparse.ArgumentParser(); add_sglang_args_arguments(p); sys.exit(run_sglang_args(p.parse_args(sys.argv[1:])))"
    )

    def sglang_args(*argv: str) -> list[str]:
        return subprocess.run(
            [sys.executable, "-c", code, "/models/qwen", *argv], capture_output=True, text=True, check=True
        ).stdout.splitlines()

    out = sglang_args("--gpus", "0,1")
    assert len(out) == 3 and out[0].startswith("CUDA_VISIBLE_DEVICES=0 ") and "--port 30001" in out[1]
    assert all(flag in out[0] for flag in REQUIRED_FLAGS)
    assert "--hicache-ratio 2 --hicache-write-policy write_through " in out[0]
    assert out[2] == "maitred serve --priority --worker http://127.0.0.1:30000 --worker http://127.0.0.1:30001"
    assert "--hicache-ratio 1.5 --hicache-write-policy write_back " in sglang_args("--hicache-ratio", "1.5")[0]


def test_policy_names_of_the_cli_are_the_policies():
    assert set(POLICY_NAMES) == set(POLICIES)


def test_serve_passes_the_tier_sizing_flags_to_the_runtime_state():
    """``--busy-margin`` and ``--overcommit-headroom`` reach the signal config the policy reads."""
    from maitred.gateway.loop import LiveDriver
    from maitred.gateway.serve import _config, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--worker", "http://127.0.0.1:1", "--no-db", "--busy-margin", "0.8", "--overcommit-headroom", "0"])
    config = _config(args, args.worker)
    cfg = LiveDriver({}, config.runtime).state.cfg
    assert (cfg.busy_margin, cfg.overcommit_headroom) == (0.8, 0.0)


def test_serve_passes_the_program_ttl_to_the_runtime():
    """``--program-ttl``: how long a program without news or ``program.end`` is kept live."""
    from maitred.gateway.serve import _config, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = parser.parse_args(["--worker", "http://127.0.0.1:1", "--no-db"])
    assert _config(default, default.worker).runtime.program_ttl_s == 3600.0
    args = parser.parse_args(["--worker", "http://127.0.0.1:1", "--no-db", "--program-ttl", "90"])
    assert _config(args, args.worker).runtime.program_ttl_s == 90.0
