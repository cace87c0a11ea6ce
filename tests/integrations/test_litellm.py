"""LiteLLM proxy: a real ``litellm`` proxy process with two simulated-worker deployments, the
maitred callback loaded from its config, and a maitred gateway as the runtime that decides."""

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

# LiteLLM fetches a price list from the network at import unless told to use its bundled copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("litellm", reason="the litellm extra is not installed")
pytest.importorskip("backoff", reason="the litellm extra (the proxy's dependencies) is not installed")

from maitred.harness.background import free_port, wait_http
from maitred.harness.local import local_cluster
from maitred.integrations.litellm import MaitredLogger, llm_end_of, normalize_base, program_id_of
from maitred.storage import SessionStore

EXAMPLE = Path(__file__).parents[2] / "examples" / "litellm_proxy" / "config.yaml"
#: Room for one program per worker (context + the runtime's 512-token reserve), so a third waits.
GPU_TOKENS = 900


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

    def program(self, program_id: str) -> dict[str, Any] | None:
        r = httpx.get(f"{self.runtime}/v1/programs/{program_id}", timeout=10)
        return r.json() if r.status_code == 200 else None

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


@pytest.fixture(scope="module")
def proxy(tmp_path_factory) -> Iterator[Proxy]:
    tmp = tmp_path_factory.mktemp("litellm")
    with ExitStack() as stack:
        db_url = f"sqlite:///{tmp / 'gateway.db'}"
        # No overcommit: the held-program test needs both workers' GPUs full with two programs.
        cluster = stack.enter_context(
            local_cluster(gpu_tokens=GPU_TOKENS, script_tools=False, db_url=db_url, time_scale=50.0, overcommit_headroom=0.0)
        )
        sims = cluster.worker_urls
        config = tmp / "config.yaml"
        config.write_text(
            EXAMPLE.read_text().replace("http://127.0.0.1:30001", sims[0]).replace("http://127.0.0.1:30002", sims[1])
        )
        port, key = free_port(), "sk-" + secrets.token_hex(16)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MAITRED_")},
            "LITELLM_MASTER_KEY": key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "MAITRED_URL": cluster.gateway_url,
        }
        log = stack.enter_context(open(tmp / "proxy.log", "w"))
        litellm_cli = Path(sys.executable).with_name("litellm")
        process = subprocess.Popen(
            [str(litellm_cli), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=240, process=process)
            yield Proxy(f"http://127.0.0.1:{port}", key, cluster.gateway_url, [normalize_base(s) or "" for s in sims], db_url)
        finally:
            process.terminate()
            process.wait(30)


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
