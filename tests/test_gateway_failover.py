"""A worker killed mid-run (kill -9 of a real process): its programs are re-placed on the other
worker and every client request completes."""

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.loop import LiveConfig
from maitred.harness.background import BackgroundServer, free_port, wait_http

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sim_processes() -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    procs = []
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "maitred.sim.worker", "--port", str(port), "--gpu-tokens", "200000", "--time-scale", "5"]
        )
        url = f"http://127.0.0.1:{port}"
        procs.append((proc, url))
    try:
        for proc, url in procs:
            wait_http(url + "/health", timeout_s=60, process=proc)
        yield procs
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


async def test_killed_worker_programs_move_and_no_request_fails(sim_processes):
    (victim, victim_url), (_, survivor_url) = sim_processes
    gateway = build_app(
        ServeConfig([victim_url, survivor_url], runtime=LiveConfig(tick_s=0.2, poll_s=0.2), wait_for_workers_s=10)
    )
    statuses: Counter[int] = Counter()
    homes: dict[str, set[str]] = {}
    killed = asyncio.Event()

    async def program(client: httpx.AsyncClient, pid: str) -> None:
        history = [{"role": "user", "content": f"{pid} " + "word " * 400}]
        await asyncio.sleep(0.03 * int(pid[1:]))
        for step in range(6):
            r = await client.post(
                "/v1/chat/completions", json={"model": "sim", "program_id": pid, "messages": history, "max_tokens": 32}
            )
            statuses[r.status_code] += 1
            assert r.status_code == 200, r.text
            history += [r.json()["choices"][0]["message"], {"role": "user", "content": f"result {step} " * 20}]
            homes.setdefault(pid, set()).add((await client.get(f"/v1/programs/{pid}")).json()["worker"])
            if step == 1 and pid == "p0":
                killed.set()

    with BackgroundServer(gateway.app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            runs = [asyncio.create_task(program(client, f"p{i}")) for i in range(12)]
            await killed.wait()
            on_victim = [p["program_id"] for p in (await client.get("/v1/programs")).json() if p["worker"] == victim_url]
            assert on_victim, "some programs live on the worker about to die"
            os.kill(victim.pid, signal.SIGKILL)
            await asyncio.gather(*runs)
            after = {p["program_id"]: p["worker"] for p in (await client.get("/v1/programs")).json()}
            metrics = (await client.get("/metrics")).text
    assert statuses == {200: 72}
    assert all(after[pid] == survivor_url for pid in on_victim)
    assert any(homes[pid] == {victim_url, survivor_url} for pid in on_victim)
    series = f'maitred_worker_failures_total{{worker="{victim_url}"}} '
    assert [float(line.removeprefix(series)) >= 1 for line in metrics.splitlines() if line.startswith(series)] == [True]
    assert victim.wait(5) == -signal.SIGKILL
