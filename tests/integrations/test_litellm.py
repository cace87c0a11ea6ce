"""LiteLLM proxy: a real ``litellm`` proxy process, run from a venv with only maitred's
``[litellm]`` extra installed, with two ``maitred sim-worker`` deployments, the maitred callback
loaded from the example config, and ``maitred serve`` over the same workers as the runtime that
decides."""

import json
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

# LiteLLM fetches a price list from the network at import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("litellm", reason="the litellm extra is not installed")

from maitred.harness.background import free_port, wait_http
from maitred.integrations.claude_code_hook import settings_json
from maitred.integrations.litellm import MaitredLogger, llm_end_of, normalize_base, program_id_of
from maitred.storage import SessionStore
from tests.helpers import wait_until
from tests.integrations.claude_cli import SCRIPT_TURNS, check_session, claude_binary, command_hooks, run
from tests.integrations.venvs import cached_venv, stop_server

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "litellm_proxy" / "config.yaml"
#: Room for one program per worker (context + the runtime's 512-token reserve), so a third waits.
GPU_TOKENS = 900

# Building the extra's venv (first run only) and starting the proxy outlast the default timeout.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="session")
def litellm_venv(pytestconfig) -> Path:
    """A venv with only ``pip install -e '.[litellm]'``: the proxy must start from the extra
    alone (``.[dev]`` pulls in modules the proxy imports, hiding a missing one); built once,
    keyed by ``pyproject.toml`` (``tests/integrations/venvs.py``)."""
    return cached_venv(
        pytestconfig,
        "litellm-extra",
        ["-e", f"{REPO}[litellm]"],
        key=REPO.joinpath("pyproject.toml").read_bytes(),
        what="only maitred[litellm]",
    )


def _start(stack: ExitStack, argv: list[str], *, health: str, log: Path, env: dict[str, str], timeout_s: float) -> None:
    """Start ``argv`` as a child process (stopped when ``stack`` closes) and wait until ``health``
    answers; if it never does, the error carries the end of the process's output."""
    out = stack.enter_context(open(log, "w"))
    process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    stack.callback(stop_server, process)
    try:
        wait_http(health, timeout_s=timeout_s, process=process)
    except (RuntimeError, TimeoutError) as exc:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"{exc}\n--- the end of {log.name} ---\n{tail}") from None


@dataclass
class Proxy:
    url: str
    key: str
    runtime: str
    workers: list[str]
    db_url: str

    def chat(self, program_id: str, *, stream: bool = False, how: str = "metadata", words: int = 20) -> tuple[str, str]:
        """One chat request of ``program_id``; returns (the deployment's api_base, the text)."""
        body: dict[str, Any] = {
            "model": "sim",
            "messages": [{"role": "user", "content": f"{program_id}: " + "fix the test " * words}],
            "max_tokens": 8,
            "stream": stream,
        }
        headers = {"authorization": f"Bearer {self.key}"}
        if how == "metadata":
            body["metadata"] = {"program_id": program_id}
        elif how == "body":
            body["program_id"] = program_id
        else:
            headers["x-program-id"] = program_id
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
            text = r.read().decode()
            assert r.status_code == 200, text
            return normalize_base(r.headers["x-litellm-model-api-base"]) or "", text

    def claude_code(self, session_id: str, messages: list[dict[str, Any]]) -> tuple[str, str]:
        """One model call as Claude Code makes it through a proxy (``ANTHROPIC_BASE_URL``): an
        Anthropic ``/v1/messages`` stream with its ``metadata.user_id``, system blocks and tools,
        and the session in ``x-claude-code-session-id``; returns (the deployment's api_base, the
        event stream)."""
        body = {
            "model": "sim",
            "max_tokens": 8,
            "stream": True,
            "metadata": {"user_id": f"user_{'0' * 64}_account__session_{session_id}"},
            "system": [
                {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
                {"type": "text", "text": "Work in the repository. " * 20, "cache_control": {"type": "ephemeral"}},
            ],
            "tools": [
                {
                    "name": "Bash",
                    "description": "Run a shell command.",
                    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
                }
            ],
            "messages": messages,
        }
        headers = {
            "authorization": f"Bearer {self.key}",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
            "x-app": "cli",
            "user-agent": "claude-cli/2.0.0 (external, cli)",
            "x-claude-code-session-id": session_id,
        }
        with httpx.stream("POST", f"{self.url}/v1/messages", json=body, headers=headers, timeout=120) as r:
            text = r.read().decode()
            assert r.status_code == 200, text
            return normalize_base(r.headers["x-litellm-model-api-base"]) or "", text

    def program(self, program_id: str) -> dict[str, Any] | None:
        r = httpx.get(f"{self.runtime}/v1/programs/{program_id}", timeout=10)
        return r.json() if r.status_code == 200 else None

    def events(self, program_id: str, kind: str) -> list[dict[str, Any]]:
        """The program's events of type ``kind`` in the runtime's store."""
        with SessionStore(self.db_url) as store:
            return [e for e in store.events(program_id) if e["type"] == kind]

    def served(self, program_id: str) -> list[dict[str, Any]]:
        """The program's model calls the store has an ``llm.end`` for (with the worker that served it)."""
        with SessionStore(self.db_url) as store:
            timeline = store.program(program_id)
        return [s.detail for s in timeline.spans if s.kind == "llm" and s.detail["worker"]] if timeline else []

    def end(self, program_id: str, requests: int) -> None:
        """End the program once the ``llm.end`` of each of its requests has arrived: LiteLLM logs
        a call after answering it, and an event that arrives after ``program.end`` would bring
        the program back in the runtime."""
        deadline = time.monotonic() + 30
        while len(self.served(program_id)) < requests:
            assert time.monotonic() < deadline, f"{program_id}: the llm.end of {requests} requests never arrived"
            time.sleep(0.1)
        event = {"type": "program.end", "ts": time.time(), "program_id": program_id, "status": "ok"}
        assert httpx.post(f"{self.runtime}/v1/events", json=[event], timeout=10).status_code == 200


@contextmanager
def litellm_cluster(tmp: Path, litellm_venv: Path, *, gpu_tokens: int, script: Path | None = None) -> Iterator[Proxy]:
    """Two ``maitred sim-worker`` processes, ``maitred serve`` as the runtime, and the LiteLLM
    proxy (from the extra's venv) with the shipped config and maitred's callback in front."""
    maitred = [sys.executable, "-m", "maitred"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAITRED_")}
    with ExitStack() as stack:
        sims = []
        for name in ("a", "b"):
            port = free_port()
            argv = [*maitred, "sim-worker", "--port", str(port), "--gpu-tokens", str(gpu_tokens), "--time-scale", "50"]
            argv += ["--script", str(script)] if script is not None else []
            _start(stack, argv, health=f"http://127.0.0.1:{port}/health", log=tmp / f"sim-{name}.log", env=env, timeout_s=60)
            sims.append(f"http://127.0.0.1:{port}")
        db_url, port = f"sqlite:///{tmp / 'runtime.db'}", free_port()
        # No overcommit: the held-program test needs both workers' GPUs full with two programs.
        argv = [*maitred, "serve", "--port", str(port), "--db", db_url, "--overcommit-headroom", "0", "--tick", "0.2"]
        argv += [arg for sim in sims for arg in ("--worker", sim)]
        runtime = f"http://127.0.0.1:{port}"
        _start(stack, argv, health=f"{runtime}/healthz", log=tmp / "serve.log", env=env, timeout_s=60)
        config = tmp / "config.yaml"
        config.write_text(
            EXAMPLE.read_text().replace("http://127.0.0.1:30001", sims[0]).replace("http://127.0.0.1:30002", sims[1])
        )
        port, key = free_port(), "sk-" + secrets.token_hex(16)
        # The extra's venv alone: nothing of this interpreter's packages on the proxy's path.
        proxy_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proxy_env |= {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "MAITRED_URL": runtime}
        argv = [str(litellm_venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
        url = f"http://127.0.0.1:{port}"
        _start(stack, argv, health=f"{url}/health/liveliness", log=tmp / "proxy.log", env=proxy_env, timeout_s=240)
        yield Proxy(url, key, runtime, [normalize_base(s) or "" for s in sims], db_url)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, litellm_venv) -> Iterator[Proxy]:
    with litellm_cluster(tmp_path_factory.mktemp("litellm"), litellm_venv, gpu_tokens=GPU_TOKENS) as running:
        yield running


def test_the_claude_code_cli_through_the_proxy_is_admitted_pinned_and_loses_nothing(tmp_path, litellm_venv):
    """The real CLI with ``ANTHROPIC_BASE_URL`` at the proxy: every model call admitted by the
    runtime under the session (or its subagent's child program), the session on one worker,
    and every hook event stored."""
    binary, why = claude_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Claude Code CLI tests: {why}")
        pytest.skip(f"the Claude Code CLI is not available: {why}")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT_TURNS))
    with litellm_cluster(tmp_path, litellm_venv, gpu_tokens=400_000, script=script) as running:
        env = {**command_hooks(tmp_path, MAITRED_URL=running.runtime), "ANTHROPIC_API_KEY": running.key}
        session = run(binary, tmp_path, "project", running.url, json.loads(settings_json()), env, "--model", "sim")
        check_session(running.db_url, session)
        sid = session.session_id

        # Every call admitted (an llm.start from the callback) and answered (its llm.end): the
        # seven turns of the main script and the one after the background child's notification.
        def settled() -> bool:
            return len(running.served(sid)) == len(running.events(sid, "llm.start")) >= 8

        assert wait_until(settled, timeout=30), (running.served(sid), running.events(sid, "llm.start"))
        assert len({call["worker"] for call in running.served(sid)}) == 1
        with SessionStore(running.db_url) as store:  # the subagents' calls are theirs (x-claude-code-agent-id)
            children = {e["program_id"] for e in store.events() if e["program_id"].startswith(f"{sid}/")}
        assert len(children) == 2 and all(len(running.events(c, "llm.start")) == 2 for c in children)


def test_claude_code_calls_of_a_session_are_admitted_and_stay_on_one_worker(proxy):
    session = str(uuid.uuid4())
    messages: list[dict[str, Any]] = []
    landed = []
    for turn in range(4):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"step {turn}: fix the failing test"}]})
        worker, stream = proxy.claude_code(session, messages)
        assert "event: message_start" in stream and "event: message_stop" in stream
        landed.append(worker)
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"done with step {turn}"}]})
    info = proxy.program(session)
    assert info is not None, "the runtime never heard of the Claude Code session"
    assert landed == [normalize_base(info["worker"])] * 4
    proxy.end(session, 4)
    assert len(proxy.events(session, "llm.start")) == 4  # each call admitted under the session id
    served = proxy.served(session)
    assert {d["worker"] for d in served} == {landed[0]}
    assert served[-1]["cached_tokens"] > 0  # the session's prefix, cached on the worker it stayed on


def test_requests_of_a_program_keep_landing_on_the_worker_the_runtime_assigned(proxy):
    landed: dict[str, list[str]] = {"p-alpha": [], "p-beta": []}
    for how, stream in (("metadata", False), ("body", True), ("header", False), ("metadata", True)):
        for pid in landed:
            worker, text = proxy.chat(pid, stream=stream, how=how)
            landed[pid].append(worker)
            assert ("data: " in text) == stream
    assigned = {pid: normalize_base(proxy.program(pid)["worker"]) for pid in landed}
    assert landed == {pid: [assigned[pid]] * 4 for pid in landed}
    assert assigned["p-alpha"] != assigned["p-beta"]  # room for one program per worker
    assert all(proxy.program(pid)["gpu_tier"] for pid in landed)
    for pid in landed:
        proxy.end(pid, 4)


def test_llm_events_with_cached_tokens_reach_the_store(proxy):
    landed = {proxy.chat("p-cache")[0] for _ in range(3)}
    proxy.end("p-cache", 3)
    served = proxy.served("p-cache")
    assert len(served) == 3 and all(d["prompt_tokens"] > 0 and d["completion_tokens"] > 0 for d in served)
    assert {d["worker"] for d in served} == landed and len(landed) == 1
    assert served[-1]["cached_tokens"] > 0  # the same prompt again: a prefix hit on the same worker


def test_a_held_program_is_released_when_the_runtime_admits_it(proxy):
    first, _ = proxy.chat("p-one")
    second, _ = proxy.chat("p-two")
    assert {first, second} == set(proxy.workers)
    outcome: dict[str, str] = {}
    waiting = threading.Thread(target=lambda: outcome.setdefault("worker", proxy.chat("p-three")[0]))
    waiting.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proxy.program("p-three") is None:
        time.sleep(0.05)
    info = proxy.program("p-three")
    assert info is not None and not info["gpu_tier"]
    assert waiting.is_alive() and not outcome  # held in the proxy while both workers are full
    proxy.end("p-one", 1)
    waiting.join(60)
    assert outcome == {"worker": first}
    proxy.end("p-two", 1)
    proxy.end("p-three", 1)


def test_hooks_are_defined_on_the_class_itself():
    for hook in ("async_pre_call_hook", "async_filter_deployments", "async_log_success_event", "async_log_failure_event"):
        assert hook in vars(MaitredLogger), hook


def test_program_id_sources_and_a_call_without_one():
    assert program_id_of({"program_id": "a", "metadata": {"program_id": "b"}}) == "a"
    assert program_id_of({"metadata": {"program_id": "b", "headers": {"X-Program-Id": "c"}}}) == "b"
    assert program_id_of({"metadata": {"headers": {"x-litellm-session-id": "s", "X-Claude-Code-Session-Id": "cc"}}}) == "s"
    assert program_id_of({"metadata": {}}) is None
    assert llm_end_of({"litellm_params": {"metadata": {}}, "standard_logging_object": {}}, "ok") is None
    assert normalize_base("HTTP://127.0.0.1:30001/v1/") == "http://127.0.0.1:30001"


def test_a_worker_has_one_name_whatever_endpoint_litellm_reports():
    for reported in (
        "http://127.0.0.1:30001/v1/chat/completions",
        "http://127.0.0.1:30001/v1/messages",
        "http://127.0.0.1:30001",
    ):
        assert normalize_base(reported) == "http://127.0.0.1:30001"
        slo = {"api_base": reported, "prompt_tokens": 3, "completion_tokens": 1}
        event = llm_end_of({"litellm_params": {"metadata": {"program_id": "p"}}, "standard_logging_object": slo}, "ok")
        assert event is not None and event.worker == "http://127.0.0.1:30001"


def test_on_v1_messages_the_program_and_worker_live_in_the_proxys_litellm_metadata(monkeypatch):
    """On ``/v1/messages`` ``metadata`` is Anthropic's body field (Claude Code's ``user_id``); the
    proxy's headers, and what the hooks leave for each other, are in ``litellm_metadata``."""
    import asyncio

    monkeypatch.delenv("MAITRED_URL", raising=False)
    logger = MaitredLogger()
    data = {"metadata": {"user_id": "user_x"}, "litellm_metadata": {"headers": {"X-Claude-Code-Session-Id": "cc-1"}}}
    assert program_id_of(data) == "cc-1"
    out = asyncio.run(logger.async_pre_call_hook(None, None, data, "anthropic_messages"))
    assert out["metadata"] == {"user_id": "user_x"}  # Anthropic's field goes on untouched
    assert out["litellm_metadata"]["maitred_program_id"] == "cc-1"
    out["litellm_metadata"]["maitred_worker"] = "http://127.0.0.1:30002"
    deployments = [{"litellm_params": {"api_base": f"http://127.0.0.1:{port}/v1"}} for port in (30001, 30002)]
    kept = asyncio.run(logger.async_filter_deployments("sim", deployments, None, request_kwargs=out))
    assert kept == deployments[1:]


def test_an_unavailable_runtime_is_not_waited_on_and_is_reported_once(caplog):
    import asyncio

    from tests.helpers import free_port as closed_port

    # An admission wait would outlast the test's timeout: the hook must not wait at all.
    logger = MaitredLogger(f"http://127.0.0.1:{closed_port()}", admission_timeout_s=3600)
    data = {"model": "sim", "metadata": {"program_id": "p-down"}, "messages": []}

    async def twice() -> list[dict]:
        return [await logger.async_pre_call_hook(None, None, dict(data), "completion") for _ in range(2)]

    with caplog.at_level("WARNING", logger="maitred"):
        results = asyncio.run(twice())
    assert [r["program_id"] for r in results] == ["p-down", "p-down"]
    assert all("maitred_worker" not in r["metadata"] for r in results)
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1
