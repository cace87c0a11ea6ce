"""What a request costs the gateway and the workers when it should cost nothing: a client that
leaves while a worker answers it, a prompt no worker can hold, and the prompts kept for warmups.
Real servers on 127.0.0.1: simulated SGLang workers and the gateway, each under uvicorn."""

import asyncio
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from maitred.gateway.app import Gateway, ServeConfig, build_app
from maitred.gateway.loop import LiveConfig
from maitred.gateway.prompt_keep import PromptLimits
from maitred.harness.background import BackgroundServer
from maitred.sim.profile import EngineProfile
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.engine import RealtimeEngine

pytestmark = pytest.mark.anyio
FAST = LiveConfig(tick_s=0.2, poll_s=0.2, hold_timeout_s=30.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Setup:
    workers: list[BackgroundServer]
    gateway: Gateway
    server: BackgroundServer

    def engine(self, i: int = 0) -> RealtimeEngine:
        engine: RealtimeEngine = self.workers[i].app.state.sim.engine
        return engine

    def metric(self, text: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.fixture
def setup() -> Iterator[Callable[..., Setup]]:
    with ExitStack() as stack:

        def make(
            *,
            workers: int = 1,
            gpu_tokens: int = 200_000,
            time_scale: float = 20.0,
            runtime: LiveConfig = FAST,
            profile: str | None = None,
        ) -> Setup:
            config = SimWorkerConfig(gpu_tokens=gpu_tokens, time_scale=time_scale, abort_check_s=0.05, profile=profile)
            sims = [stack.enter_context(BackgroundServer(create_app(config))) for _ in range(workers)]
            gateway = build_app(ServeConfig([s.url for s in sims], runtime=runtime, wait_for_workers_s=10))
            return Setup(sims, gateway, stack.enter_context(BackgroundServer(gateway.app)))

        yield make


async def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _long_chat(pid: str, **extra: Any) -> dict[str, Any]:
    """A request whose answer takes the simulated GPU (at time scale 1) far longer than the test."""
    return {
        "model": "sim",
        "program_id": pid,
        "messages": [{"role": "user", "content": "write a novel"}],
        "max_tokens": 60_000,
        **extra,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole-answer", "stream"])
async def test_a_client_that_leaves_stops_the_generation_on_the_worker(setup, stream):
    """The worker stops generating an answer nobody will read: the gateway closes its connection
    to the worker when the client leaves, and the worker (like SGLang) aborts the request."""
    s = setup(time_scale=1.0)
    engine = s.engine()
    async with httpx.AsyncClient(base_url=s.server.url, timeout=60) as client:

        async def ask() -> None:
            if stream:
                async with client.stream("POST", "/v1/chat/completions", json=_long_chat("p-leaves", stream=True)) as r:
                    async for _ in r.aiter_bytes():
                        pass
            else:
                await client.post("/v1/chat/completions", json=_long_chat("p-leaves"))

        asking = asyncio.create_task(ask())
        assert await _until(lambda: len(engine.worker.running) == 1)  # the worker is generating it
        asking.cancel()  # the client goes away: httpx closes its connection
        with pytest.raises(asyncio.CancelledError):
            await asking
        assert await _until(lambda: not engine.busy())
        assert (engine.counters.aborted, engine.counters.requests) == (1, 0)
        metrics = (await client.get("/metrics")).text
        healthz = (await client.get("/healthz")).json()
    assert healthz["requests_in_flight"] == 0
    assert s.gateway.proxy.connections_in_use() == 0
    if not stream:
        assert s.metric(metrics, 'maitred_requests_total{endpoint="chat",outcome="client_gone"}') == 1


async def test_a_stream_whose_client_leaves_before_its_first_token_is_aborted_on_the_worker(setup, tmp_path):
    """A stream queued on a busy worker sends no token for as long as it waits: its client leaving
    then closes the worker's connection too, instead of when the first token comes."""
    profile = tmp_path / "one-slot.json"
    replace(EngineProfile(), max_running=1).save(profile)
    s = setup(time_scale=1.0, profile=str(profile))
    engine = s.engine()
    async with httpx.AsyncClient(base_url=s.server.url, timeout=60) as client:

        async def stream() -> None:
            async with client.stream("POST", "/v1/chat/completions", json=_long_chat("p-queued", stream=True)) as r:
                async for _ in r.aiter_bytes():
                    pass

        blocking = asyncio.create_task(client.post("/v1/chat/completions", json=_long_chat("p-first")))
        assert await _until(lambda: len(engine.worker.running) == 1)
        queued = asyncio.create_task(stream())
        assert await _until(lambda: len(engine.worker.queue) == 1)  # waiting for the only slot
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert await _until(lambda: not engine.worker.queue)
        assert engine.counters.aborted == 1 and len(engine.worker.running) == 1
        blocking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocking
        assert await _until(lambda: not engine.busy())
        assert (engine.counters.aborted, engine.counters.requests) == (2, 0)


async def test_a_prompt_larger_than_every_worker_is_refused_at_once_naming_sizes(setup):
    s = setup(workers=2, gpu_tokens=20_000)
    body = {"model": "sim", "program_id": "p-huge", "messages": [{"role": "user", "content": "word " * 200_000}]}
    async with httpx.AsyncClient(base_url=s.server.url, timeout=120) as client:
        r = await client.post("/v1/chat/completions", json=body)
        anthropic = await client.post("/v1/messages", json={**body, "max_tokens": 8}, headers={"x-program-id": "p-huge-2"})
        metrics = (await client.get("/metrics")).text
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["field"] == "messages"
    assert "at least 125,002 tokens" in error["message"] and "20,000 tokens" in error["message"]
    assert anthropic.status_code == 400 and anthropic.json()["type"] == "error"  # Anthropic's shape on its route
    assert "20,000 tokens" in anthropic.json()["error"]["message"]
    assert s.metric(metrics, 'maitred_requests_total{endpoint="chat",outcome="refused"}') == 1
    assert s.metric(metrics, "maitred_queue_wait_seconds_count") == 0  # never held
    assert [s.engine(i).counters.requests for i in range(2)] == [0, 0]  # no worker saw it
    assert "p-huge" not in s.gateway.runtime.warm_prompts


async def test_prompts_kept_for_warmups_are_bounded_and_freed_when_refused(setup):
    limits = PromptLimits(max_prompt_bytes=64 << 10, max_total_bytes=1 << 20, max_prompts=3)
    s = setup(runtime=replace(FAST, prompts=limits))
    kept = s.gateway.runtime.warm_prompts
    async with httpx.AsyncClient(base_url=s.server.url, timeout=60) as client:
        for i in range(5):
            body = {
                "model": "sim",
                "program_id": f"p{i}",
                "messages": [{"role": "user", "content": f"task {i}"}],
                "max_tokens": 4,
            }
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        assert len(kept) == 3 and all(f"p{i}" in kept for i in (2, 3, 4))  # the least recent went first
        assert s.gateway.runtime.core.prompts.last == {"p2", "p3", "p4"}  # the core knows which it can warm

        big = {"model": "sim", "program_id": "p4", "messages": [{"role": "user", "content": "word " * 20_000}], "max_tokens": 4}
        assert (await client.post("/v1/chat/completions", json=big)).status_code == 200
        assert "p4" not in kept  # over max_prompt_bytes: not kept, and the older prompt is stale

        refused = {"model": "sim", "program_id": "p3", "messages": [{"role": "user", "content": "again"}], "max_tokens": 500_000}
        r = await client.post("/v1/chat/completions", json=refused)
        assert r.status_code == 400, r.text  # the worker refused it (max_tokens over its capacity)
        assert "p3" not in kept and "p3" not in s.gateway.runtime.core.prompts.last
    assert kept.total_bytes <= limits.max_total_bytes and len(kept) == 1
