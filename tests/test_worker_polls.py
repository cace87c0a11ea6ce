"""The gateway's worker polls ask only what it does not know: a worker that just answered a
request is asked ``/health`` at every other poll only, and a load the step just read is not read
again; an idle worker is still asked every interval, one that stops answering is still found
down, and so is one whose ``/health`` fails while it still answers requests (SGLang draining
after SIGTERM)."""

import asyncio
from collections import Counter
from typing import Any

import httpx
import pytest

from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.loop import LiveConfig
from maitred.harness.background import BackgroundServer
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.server import SimWorkerThread

pytestmark = pytest.mark.anyio

POLL_S = 0.4


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Counting:
    """A worker backend that counts the health checks and load readings asked of it; with
    ``draining`` set its ``/health`` answer reads as failed while everything else still works."""

    def __init__(self, inner: Any, calls: Counter[str]) -> None:
        self.inner, self.calls = inner, calls
        self.draining = False

    async def healthy(self) -> bool:
        self.calls["health"] += 1
        return bool(await self.inner.healthy()) and not self.draining

    async def load(self) -> Any:
        self.calls["load"] += 1
        return await self.inner.load()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def _counting_polls(gateway: Any, calls: Counter[str]) -> None:
    watch = gateway.runtime.watch
    check_all = watch.check_all

    async def counted() -> None:
        calls["poll"] += 1
        await check_all()

    watch.check_all = counted


async def test_busy_worker_is_not_asked_what_its_answers_told() -> None:
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=100_000, time_scale=50.0)) as worker:
        gateway = build_app(ServeConfig([worker.url], runtime=LiveConfig(poll_s=POLL_S), wait_for_workers_s=10))
        calls: Counter[str] = Counter()
        gateway.runtime.backends[worker.url] = Counting(gateway.runtime.backends[worker.url], calls)
        await _counting_polls(gateway, calls)
        with BackgroundServer(gateway.app) as server:
            await asyncio.sleep(POLL_S * 4)  # idle: every poll asks
            idle = Counter(calls)
            # (a poll counted may not have reached its health check yet)
            assert idle["poll"] >= 2 and idle["poll"] - 1 <= idle["health"] <= idle["poll"]

            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

                async def program(n: int) -> None:
                    body = {"model": "sim", "program_id": f"p{n}", "max_tokens": 4}
                    loop = asyncio.get_running_loop()
                    end = loop.time() + POLL_S * 6
                    while loop.time() < end:
                        r = await client.post(
                            "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "hi"}]}
                        )
                        assert r.status_code == 200, r.text

                await asyncio.gather(*(program(n) for n in range(4)))
                busy = calls - idle
                assert busy["poll"] >= 3
                # answered requests stand in for every other /health, the steps' load readings for the poll's
                assert busy["health"] < busy["poll"], (busy, idle)
                steps = (await client.get("/metrics")).text
                assert "maitred_worker_failures_total" in steps
                health = (await client.get("/healthz")).json()
                assert health["workers"] == {worker.url: True}


async def test_worker_that_stops_answering_is_found_down() -> None:
    worker = SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=100_000, time_scale=50.0)).start()
    try:
        gateway = build_app(
            ServeConfig([worker.url], runtime=LiveConfig(poll_s=0.2, tick_s=0.05, fail_after=2), wait_for_workers_s=10)
        )
        with BackgroundServer(gateway.app) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                r = await client.post(
                    "/v1/chat/completions",
                    json={"model": "sim", "program_id": "p", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 200
                worker.stop()  # just answered: only the polls that follow can find it gone
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while (await client.get("/healthz")).json()["workers"][worker.url] and loop.time() < end:
                    await asyncio.sleep(0.05)
                assert (await client.get("/healthz")).json()["workers"] == {worker.url: False}
    finally:
        worker.stop()


async def test_busy_worker_whose_health_fails_is_found_down() -> None:
    with SimWorkerThread(SimWorkerConfig(port=0, gpu_tokens=100_000, time_scale=50.0)) as worker:
        gateway = build_app(
            ServeConfig([worker.url], runtime=LiveConfig(poll_s=0.2, tick_s=0.05, fail_after=2), wait_for_workers_s=10)
        )
        calls: Counter[str] = Counter()
        backend = Counting(gateway.runtime.backends[worker.url], calls)
        gateway.runtime.backends[worker.url] = backend
        with BackgroundServer(gateway.app) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                backend.draining = True  # /health fails; requests and loads are still answered
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                down = False
                while not down and loop.time() < end:
                    r = await client.post(
                        "/v1/chat/completions",
                        json={
                            "model": "sim",
                            "program_id": "p",
                            "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}],
                        },
                    )
                    down = r.status_code == 503 or not (await client.get("/healthz")).json()["workers"][worker.url]
                assert down, calls
                assert (await client.get("/healthz")).json()["workers"] == {worker.url: False}
