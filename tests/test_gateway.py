"""The gateway end to end: real servers on 127.0.0.1 — simulated SGLang workers (the documented
stand-in for a GPU) and the gateway, each under uvicorn — and real HTTP clients."""

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import httpx
import pytest

from maitred.gateway.app import Gateway, ServeConfig, build_app
from maitred.gateway.guard import HTTPProblem
from maitred.gateway.loop import LiveConfig, LiveDriver
from maitred.gateway.programid import take_program_id
from maitred.gateway.proxy_config import ProxyConfig
from maitred.gateway.sglang.client import SGLangClient
from maitred.harness.background import BackgroundServer, free_port
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig
from maitred.sim.worker.server import SimWorkerThread
from maitred.storage import SessionStore

pytestmark = pytest.mark.anyio
FAST = LiveConfig(tick_s=0.2, poll_s=0.2, hold_timeout_s=30.0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Cluster:
    workers: list[BackgroundServer]
    gateway: Gateway
    server: BackgroundServer

    @property
    def url(self) -> str:
        return self.server.url

    def metric(self, text: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.fixture
def cluster() -> Iterator[Callable[..., Cluster]]:
    with ExitStack() as stack:

        def make(
            *,
            workers: int = 2,
            gpu_tokens: int = 200_000,
            cpu_tokens: int = 0,
            time_scale: float = 20.0,
            runtime: LiveConfig = FAST,
            **serve: Any,
        ) -> Cluster:
            sims = [
                stack.enter_context(
                    BackgroundServer(
                        create_app(SimWorkerConfig(gpu_tokens=gpu_tokens, cpu_tokens=cpu_tokens, time_scale=time_scale))
                    )
                )
                for _ in range(workers)
            ]
            gateway = build_app(ServeConfig([s.url for s in sims], runtime=runtime, wait_for_workers_s=10, **serve))
            server = stack.enter_context(BackgroundServer(gateway.app))
            return Cluster(sims, gateway, server)

        yield make


def chat(pid: str | None, history: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "sim", "messages": history, "max_tokens": 16, **extra}
    if pid is not None:
        body["program_id"] = pid
    return body


def event(kind: str, pid: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "ts": time.time(), "program_id": pid, **fields}


async def run_program(
    client: httpx.AsyncClient,
    pid: str,
    steps: int,
    *,
    context_words: int = 200,
    tool_s: float = 0.05,
    end: bool = True,
    start_after_s: float = 0.0,
) -> list[str]:
    """One agent: model step, tool call (reported as events), next step with a longer context.
    Returns the worker the program was on after each step."""
    await asyncio.sleep(start_after_s)
    history = [
        {"role": "system", "content": "you are a careful coding agent " * 8},
        {"role": "user", "content": f"task {pid}: " + "fix the failing test " * (context_words // 4)},
    ]
    workers = []
    for step in range(steps):
        r = await client.post("/v1/chat/completions", json=chat(pid, history))
        assert r.status_code == 200, r.text
        history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        info = (await client.get(f"/v1/programs/{pid}")).json()
        workers.append(info["worker"])
        call = f"{pid}-c{step}"
        await client.post("/v1/events", json=[event("tool.start", pid, call_id=call, tool="pytest")])
        await asyncio.sleep(tool_s)
        await client.post("/v1/events", json=[event("tool.end", pid, call_id=call)])
        history.append({"role": "user", "content": f"tool output {step}: " + "ok " * 40})
    if end:
        await client.post("/v1/events", json=[event("program.end", pid)])
    return workers


def streamed_text(sse: str) -> str:
    """The text a chat stream carries (chunking depends on timing; the text does not)."""
    chunks = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


async def until(check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check() if asyncio.iscoroutinefunction(check) else check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


# -- program id ---------------------------------------------------------------------------------


def test_program_id_is_taken_in_spec_order_and_stripped_everywhere():
    body = {"model": "m", "program_id": "a", "extra_body": {"program_id": "b"}, "metadata": {"program_id": "c", "user": "u"}}
    assert take_program_id(body, {"x-program-id": "d"}) == ("a", True)
    assert body == {"model": "m", "metadata": {"user": "u"}}
    body = {"extra_body": {"program_id": "b"}, "metadata": {"program_id": "c"}}
    assert take_program_id(body, {}) == ("b", True) and body == {}
    assert take_program_id({"metadata": {"program_id": "c"}}, {"x-program-id": "d"})[0] == "c"
    for header in ("x-program-id", "x-litellm-session-id", "x-claude-code-session-id"):
        assert take_program_id({"model": "m"}, {header: "h"}) == ("h", False)
    assert take_program_id({"model": "m"}, {}) == (None, False)
    with pytest.raises(HTTPProblem, match="metadata.program_id"):
        take_program_id({"metadata": {"program_id": 7}}, {})
    with pytest.raises(HTTPProblem, match="program_id"):
        take_program_id({"program_id": "x" * 300}, {})


# -- routing, stickiness, feedback ----------------------------------------------------------------


async def test_concurrent_programs_stay_on_their_workers_and_cached_tokens_reach_state_and_store(cluster, db_url):
    c = cluster(db_url=db_url)
    pids = [f"p{i}" for i in range(16)]
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        # Agents start a little apart (as they do): each placement sees the load of the last ones.
        placements = await asyncio.gather(
            *(run_program(client, pid, 4, end=False, start_after_s=0.05 * i) for i, pid in enumerate(pids))
        )
        for pid, workers in zip(pids, placements):
            assert len(set(workers)) == 1, f"{pid} moved between workers: {workers}"
        assert {w[0] for w in placements} == {s.url for s in c.workers}, "both workers get programs"
        infos = {p["program_id"]: p for p in (await client.get("/v1/programs")).json()}
        for pid in pids:
            info = infos[pid]
            assert info["last_cached_tokens"] > 0 and info["cached"][info["worker"]]["tokens"] > info["last_cached_tokens"]
            assert {"program_id", "agent", "phase", "tier", "worker", "context_tokens", "idleness", "readiness"} <= info.keys()
        metrics = (await client.get("/metrics")).text
        assert c.metric(metrics, "maitred_cached_tokens_total") > 0
        assert c.metric(metrics, 'maitred_tool_duration_seconds_count{tool="pytest"}') == 64
    with SessionStore(db_url) as store:

        def stored() -> list[dict[str, Any]]:
            return [e for e in store.events("p3") if e["type"] == "llm.end"]

        ends = await until(lambda: len(stored()) == 4 and stored())
        assert all(e["cached_tokens"] is not None for e in ends) and max(e["cached_tokens"] for e in ends) > 0
        assert {e["worker"] for e in ends} == {infos["p3"]["worker"]}
        assert len([e for e in store.events("p3") if e["type"] == "tool.end"]) == 4


async def test_requests_without_a_program_id_are_one_step_programs(cluster):
    c = cluster(workers=1)
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        rs = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=chat(None, [{"role": "user", "content": "hi"}])) for _ in range(5))
        )
        assert [r.status_code for r in rs] == [200] * 5
        assert (await client.get("/v1/programs")).json() == []
        r = await client.post(
            "/v1/completions", json={"model": "sim", "prompt": "def f(x):", "max_tokens": 4, "metadata": {"program_id": "text-1"}}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        r = await client.post(
            "/generate", json={"text": "hello world", "sampling_params": {"max_new_tokens": 3}}, headers={"X-Program-Id": "gen-1"}
        )
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 3
        assert {p["program_id"] for p in (await client.get("/v1/programs")).json()} == {"text-1", "gen-1"}


async def test_streams_pass_through_and_report_usage_without_changing_what_the_client_sees(cluster):
    c = cluster(workers=1)
    body = chat("s1", [{"role": "user", "content": "stream please " * 30}], stream=True)
    async with (
        httpx.AsyncClient(base_url=c.url, timeout=60) as client,
        httpx.AsyncClient(base_url=c.workers[0].url, timeout=60) as direct,
    ):
        through = (await client.post("/v1/chat/completions", json=body)).text
        plain = dict(body)
        del plain["program_id"]
        straight = (await direct.post("/v1/chat/completions", json=plain)).text
        assert through.endswith("data: [DONE]\n\n") and '"usage":{' not in through
        assert streamed_text(through) == streamed_text(straight) and streamed_text(through)
        info = (await client.get("/v1/programs/s1")).json()
        assert info["last_prompt_tokens"] > 0 and info["context_tokens"] > info["last_prompt_tokens"]
        asked = await client.post("/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}})
        assert '"usage":{' in asked.text and (await client.get("/v1/programs/s1")).json()["last_cached_tokens"] > 0
        gen = await client.post(
            "/generate", json={"text": "abc " * 20, "stream": True, "program_id": "g1", "sampling_params": {"max_new_tokens": 5}}
        )
        assert gen.text.endswith("data: [DONE]\n\n")
        assert (await client.get("/v1/programs/g1")).json()["last_prompt_tokens"] > 0


async def test_many_concurrent_streams_are_held_released_and_leave_nothing_behind(cluster):
    c = cluster(workers=2, runtime=replace(FAST, hold_timeout_s=1.0), gpu_tokens=400_000)
    gw = c.gateway
    limits = httpx.Limits(max_connections=300)

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = chat(f"s{i % 150}", [{"role": "user", "content": f"stream {i} " * 20}], stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            text = (await r.aread()).decode()
            assert text.endswith("data: [DONE]\n\n")
            return r.status_code

    async def tasks_now() -> int:
        return len(asyncio.all_tasks())

    assert gw.loop is not None
    baseline = asyncio.run_coroutine_threadsafe(tasks_now(), gw.loop).result(10)
    async with httpx.AsyncClient(base_url=c.url, timeout=120, limits=limits) as client:
        codes = await asyncio.gather(*(one(client, i) for i in range(300)))
        # Clients that go away mid-stream: the gateway must close their upstream streams too.
        for i in range(20):
            async with client.stream(
                "POST",
                "/v1/chat/completions",
                json=chat(f"gone{i}", [{"role": "user", "content": "x " * 50}], stream=True, max_tokens=200),
            ) as r:
                async for _ in r.aiter_raw():
                    break
    assert codes == [200] * 300

    async def settled() -> tuple[int, int, int]:
        tasks = len(asyncio.all_tasks())
        return tasks, gw.proxy.connections_in_use(), sum(gw.runtime.inflight.values())

    last: list[tuple[int, int, int]] = []

    def check() -> bool:
        last[:] = [asyncio.run_coroutine_threadsafe(settled(), gw.loop).result(10)]
        tasks, busy, inflight = last[0]
        return busy == 0 and inflight == 0 and tasks <= baseline

    # a liveness bound, not a speed one: on a loaded machine the 20 aborted upstream streams
    # can take a while to close
    try:
        await until(check, timeout_s=90)
    except AssertionError:
        raise AssertionError(f"(tasks, connections in use, in flight) = {last[0]}; tasks before: {baseline}") from None
    assert not gw.runtime._held


# -- memory pressure --------------------------------------------------------------------------------


async def test_under_memory_pressure_idle_programs_are_demoted_newcomers_held_and_all_resume(cluster):
    # Each worker holds two of these programs (2,100 tokens of context plus the 512 reserve); the
    # words are four characters, so the gateway's estimate before the first answer is the real size.
    # No host memory and no overcommit: maitred's GPU tier is the GPU, so the idle programs fill
    # it, and KV that leaves the GPU is gone. (On a write-through worker with host memory at least
    # the GPU's, the newcomers would run beside them: idle KV has a host copy there.)
    c = cluster(workers=2, gpu_tokens=6_000, runtime=replace(FAST, hold_timeout_s=1.5, overcommit_headroom=0.0))
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        first = [f"a{i}" for i in range(4)]
        histories = {}
        for pid in first:  # four programs fill both GPUs, then sit in a long tool call (idle)
            histories[pid] = [{"role": "user", "content": f"{pid} " + "tok " * 2100}]
            r = await client.post("/v1/chat/completions", json=chat(pid, histories[pid]))
            assert r.status_code == 200
            await client.post("/v1/events", json=[event("tool.start", pid, call_id="long", tool="build")])
        tiers = {p["program_id"]: p["tier"] for p in (await client.get("/v1/programs")).json()}
        assert set(tiers.values()) == {"gpu"}
        newcomers = [f"n{i}" for i in range(2)]
        started = time.monotonic()
        rs = await asyncio.gather(
            *(
                client.post("/v1/chat/completions", json=chat(pid, [{"role": "user", "content": f"{pid} " + "new " * 1400}]))
                for pid in newcomers
            )
        )
        assert [r.status_code for r in rs] == [200, 200] and time.monotonic() - started >= 1.0  # they were held
        metrics = (await client.get("/metrics")).text
        assert c.metric(metrics, "maitred_forced_admissions_total") >= 1
        assert c.metric(metrics, "maitred_held_requests_total") >= 2  # both newcomers were held, not sent

        async def some_idle_demoted() -> list[str]:
            programs = (await client.get("/v1/programs")).json()
            return [p["program_id"] for p in programs if p["program_id"] in first and p["tier"] != "gpu"]

        demoted = await until(some_idle_demoted)
        assert c.metric((await client.get("/metrics")).text, "maitred_tier_moves_total") >= 1
        for pid in demoted:  # the idle programs come back: tool ends, next step completes
            await client.post("/v1/events", json=[event("tool.end", pid, call_id="long")])
            histories[pid].append({"role": "user", "content": "build finished"})
            r = await client.post("/v1/chat/completions", json=chat(pid, histories[pid]))
            assert r.status_code == 200
            assert (await client.get(f"/v1/programs/{pid}")).json()["tier"] == "gpu"


async def test_admission_for_requests_that_reach_the_workers_another_way(cluster):
    """``POST /v1/admit`` (the LiteLLM callback's path): a program that fits is answered at once
    with its worker; one that does not is held like a gateway request, then let through."""
    c = cluster(workers=1, gpu_tokens=6_000, runtime=replace(FAST, hold_timeout_s=1.0), token="t")
    auth = {"Authorization": "Bearer t"}
    async with httpx.AsyncClient(base_url=c.url, timeout=60, headers=auth) as client:
        r = await client.post("/v1/admit", json={"program_id": "lit-1", "model": "m", "prompt_tokens": 3_000})
        assert r.status_code == 200, r.text
        assert r.json()["worker"] == c.workers[0].url and not r.json()["forced"] and r.json()["waited_s"] < 0.5
        assert (await client.get("/v1/programs/lit-1")).json()["phase"] == "reasoning"
        r = await client.post("/v1/admit", json={"program_id": "lit-2", "prompt_tokens": 5_000})
        assert r.status_code == 200 and r.json()["forced"] and r.json()["waited_s"] >= 0.9, r.text
        for body, field in (
            ({"program_id": "x", "tokens": 3}, "tokens"),
            ({"model": "m"}, "program_id"),
            ({"program_id": "x", "prompt_tokens": -1}, "prompt_tokens"),
        ):
            r = await client.post("/v1/admit", json=body)
            assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
        assert (
            await client.post("/v1/admit", json={"program_id": "x"}, headers={"Authorization": "Bearer no"})
        ).status_code == 401


# -- failures inside the gateway ------------------------------------------------------------------------


async def test_with_no_worker_answering_a_request_gets_503_naming_the_workers():
    """A worker URL nothing listens on: the gateway starts, and a request is refused with 503 and
    a message that says which worker does not answer (one JSON error, a retry-after)."""
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = build_app(ServeConfig([dead], runtime=FAST, wait_for_workers_s=0.5))
    with BackgroundServer(gateway.app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post("/v1/chat/completions", json=chat("p", [{"role": "user", "content": "hi"}]))
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["message"] == f"no worker can take the request: no healthy worker (not answering: {dead})"


@pytest.mark.parametrize("policy", ["maitred", "round_robin"])
async def test_each_workers_hicache_write_policy_reaches_its_state_and_a_mirroring_host_pool_is_warned_about(policy, caplog):
    """A worker started with ``--hicache-write-policy write_back`` is marked so (its host pool adds
    to the GPU's in maitred's tier sizing). Under maitred, one whose host pool is small enough for
    maitred to pick write-back but runs write-through gets one warning naming the flag, none
    after it comes back; one with a host pool large enough for write-through gets none."""

    def sim(cpu_tokens: int, write_policy: str) -> SimWorkerThread:
        return SimWorkerThread(
            SimWorkerConfig(port=0, gpu_tokens=50_000, cpu_tokens=cpu_tokens, time_scale=20.0, hicache_write_policy=write_policy)
        )

    with (
        sim(75_000, "write_back") as back,
        sim(75_000, "write_through") as through,
        sim(100_000, "write_through") as large,
        caplog.at_level(logging.INFO, "maitred.service"),
    ):
        async with aiohttp.ClientSession() as session:
            runtime = LiveDriver(
                {w.url: SGLangClient(w.url, lambda: session) for w in (back, through, large)},
                LiveConfig(policy=policy, tick_s=0.2, poll_s=0.2),
            )
            await runtime.start()
            try:
                workers = runtime.state.workers
                assert [workers[w.url].write_back for w in (back, through, large)] == [True, False, False]
                assert [workers[w.url].cpu_tokens for w in (back, through, large)] == [75_000, 75_000, 100_000]
                runtime.worker_failed(through.url, reason="test")
                await until(lambda: workers[through.url].healthy)  # back: its capacity is read again
            finally:
                await runtime.stop()
    up = [r.getMessage() for r in caplog.records if " is up " in r.getMessage()]
    assert f"maitred: worker {back.url} is up (50000 GPU tokens, 75000 host tokens, HiCache write_back)" in up
    assert sum(f"worker {through.url} is up" in m and "HiCache write_through" in m for m in up) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "write_back" in r.getMessage()]
    if policy == "maitred":
        assert len(warnings) == 1 and through.url in warnings[0] and "1.5 GPUs" in warnings[0]
        assert "--hicache-write-policy write_back" in warnings[0] and "only the part beyond the GPU" in warnings[0]
    else:
        assert warnings == []


async def test_a_policy_that_raises_degrades_to_plain_routing(cluster):
    c = cluster()

    def broken(view):
        raise RuntimeError("policy bug")

    c.gateway.runtime.scheduler.policy.step = broken  # type: ignore[method-assign]
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        placements = await asyncio.gather(*(run_program(client, f"p{i}", 3) for i in range(6)))
        assert all(len(w) == 3 for w in placements)
        assert c.metric((await client.get("/metrics")).text, "maitred_scheduler_errors_total") >= 1


async def test_a_scheduler_step_that_raises_still_completes_every_request(cluster):
    c = cluster(runtime=replace(FAST, hold_timeout_s=30.0))

    def broken(view):
        raise RuntimeError("scheduler bug")

    c.gateway.runtime.scheduler.plan = broken  # type: ignore[method-assign]
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        started = time.monotonic()
        placements = await asyncio.gather(*(run_program(client, f"p{i}", 3) for i in range(6)))
        assert time.monotonic() - started < 25, "requests were routed plainly, not left to the hold timeout"
        assert all(len(set(w)) == 1 for w in placements), "sticky to their workers"
        metrics = (await client.get("/metrics")).text
        assert c.metric(metrics, "maitred_scheduler_errors_total") >= 1
        assert c.metric(metrics, 'maitred_requests_total{endpoint="chat",outcome="ok"}') == 18


# -- bad input --------------------------------------------------------------------------------------------


async def test_bad_input_gets_a_clear_4xx_and_disturbs_nothing(cluster):
    c = cluster(workers=1, token="s3cret", proxy=ProxyConfig(max_body_bytes=4096), max_events_bytes=2048)
    auth = {"Authorization": "Bearer s3cret"}
    anyone = {"Authorization": ""}
    # (the token covers the model routes too: the client sends it unless a check says otherwise)
    async with httpx.AsyncClient(base_url=c.url, timeout=60, headers=auth) as client:

        async def refused(status: int, field: str | None, *args: Any, **kwargs: Any) -> None:
            r = await client.request(*args, **kwargs)
            assert r.status_code == status, r.text
            if field is not None:
                assert r.json()["error"]["field"] == field, r.text

        await refused(400, "body", "POST", "/v1/chat/completions", content=b"{not json", headers=JSON)
        await refused(400, "body", "POST", "/v1/chat/completions", content=b"[1, 2]", headers=JSON)
        await refused(400, "program_id", "POST", "/v1/chat/completions", json={"program_id": 5, "messages": []})
        await refused(400, "stream", "POST", "/v1/chat/completions", json={"stream": "yes", "messages": []})
        await refused(
            400, "x-program-id", "POST", "/v1/chat/completions", json={"messages": []}, headers={"X-Program-Id": "x" * 300}
        )
        await refused(413, "body", "POST", "/v1/chat/completions", content=b"x" * 5000, headers=JSON)

        async def chunked() -> Any:
            for _ in range(10):
                yield b"x" * 1000

        await refused(413, "body", "POST", "/v1/chat/completions", content=chunked(), headers=JSON)
        await refused(401, "authorization", "POST", "/v1/events", json=[event("program.start", "p")], headers=anyone)
        await refused(401, "authorization", "GET", "/v1/programs", headers={"Authorization": "Bearer wrong"})
        await refused(404, "program_id", "GET", "/v1/programs/nobody", headers=auth)
        await refused(400, None, "POST", "/v1/events", json=[{"type": "tool.start", "ts": "yesterday"}], headers=auth)
        await refused(400, "body", "POST", "/v1/events", content=b"[{", headers={**auth, **JSON})
        await refused(413, "body", "POST", "/v1/events", content=b"[" + b" " * 3000 + b"]", headers={**auth, **JSON})
        await refused(400, "body", "POST", "/v1/hooks/claude-code", content=b"nope", headers={**auth, **JSON})
        await refused(401, "authorization", "POST", "/v1/hooks/claude-code", json={"hook_event_name": "Stop"}, headers=anyone)
        await refused(401, "authorization", "POST", "/v1/chat/completions", json={"messages": []}, headers=anyone)

        r = await client.post(
            "/v1/events",
            headers={**auth, "content-type": "application/x-ndjson"},
            content=(
                b'{"type":"program.start","ts":%f,"program_id":"good"}\n{"type":"tool.start","ts":1,"program_id":"bad"}\n'
                % time.time()
            ),
        )
        assert r.status_code == 200 and r.json()["accepted"] == 1
        assert [x["index"] for x in r.json()["rejected"]] == [1] and r.json()["rejected"][0]["field"]
        r = await client.post("/v1/chat/completions", json=chat("good", [{"role": "user", "content": "still fine"}]))
        assert r.status_code == 200
        assert (await client.get("/v1/programs/good", headers=auth)).json()["worker"] == c.workers[0].url
        assert (await client.get("/healthz")).json()["status"] == "ok"
        assert (await client.get("/v1/stats/tools", headers=auth)).status_code == 200


JSON = {"content-type": "application/json"}


async def test_claude_code_hook_payloads_become_program_state(cluster):
    c = cluster(workers=1)
    session = "cc-session-1"
    pre = {
        "session_id": session,
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_use_id": "toolu_1",
        "tool_input": {"command": "pytest -x tests", "timeout": 120000},
    }
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        r = await client.post(
            "/v1/hooks/claude-code", json={"session_id": session, "hook_event_name": "SessionStart", "source": "startup"}
        )
        assert r.status_code == 200 and r.json() == {} and r.headers["x-maitred-accepted"] == "1"
        assert r.headers["x-maitred-mapped"] == "true"
        assert (await client.post("/v1/hooks/claude-code", json=pre)).headers["x-maitred-accepted"] == "1"
        info = (await client.get(f"/v1/programs/{session}")).json()
        assert info["phase"] == "acting" and info["tool"]["signature"] == "Bash:pytest" and info["agent"] == "main"
        r = await client.post(
            "/v1/hooks/claude-code",
            json={
                "session_id": session,
                "hook_event_name": "PostToolUse",
                "tool_name": "Bash",
                "tool_use_id": "toolu_1",
                "duration_ms": 1500,
            },
        )
        assert r.headers["x-maitred-accepted"] == "1"
        assert (await client.get(f"/v1/programs/{session}")).json()["readiness_source"] == "observed"
        stats = (await client.get("/v1/stats/tools")).json()
        assert any(row["tool"] == "Bash:pytest" and row["n"] == 1 for row in stats["tools"])
        bad = await client.post("/v1/hooks/claude-code", json={"hook_event_name": "PreToolUse", "tool_name": "Bash"})
        assert bad.status_code == 400 and "session_id" in bad.json()["error"]["message"]


async def test_a_demoted_program_about_to_return_is_warmed_with_a_prefill_only_request(cluster):
    # No overcommit (maitred's GPU tier is the GPU): six fit, the seventh is forced in.
    c = cluster(
        workers=1, gpu_tokens=40_000, cpu_tokens=40_000, runtime=replace(FAST, hold_timeout_s=1.0, overcommit_headroom=0.0)
    )
    prompts = {f"t{i}": f"t{i} " + "tok " * 6_000 for i in range(7)}

    async def step(client: httpx.AsyncClient, pid: str) -> None:
        r = await client.post(
            "/v1/completions", json={"model": "sim", "prompt": prompts[pid], "max_tokens": 4, "program_id": pid}
        )
        assert r.status_code == 200, r.text

    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        for pid in list(prompts)[:6]:
            await step(client, pid)
            await client.post("/v1/events", json=[event("tool.start", pid, call_id="c1", tool="build")])
        await step(client, "t6")
        await client.post("/v1/events", json=[event("tool.start", "t6", call_id="c1", tool="build")])

        async def demoted() -> list[str]:
            return [p["program_id"] for p in (await client.get("/v1/programs")).json() if p["tier"] == "cpu"]

        down = await until(demoted)
        for pid in prompts:  # the others finish; the demoted ones' tools end: they will ask again soon
            if pid not in down:
                await client.post("/v1/events", json=[event("program.end", pid)])
        for pid in down:
            await client.post("/v1/events", json=[event("tool.end", pid, call_id="c1")])

        async def warmed() -> float:
            return c.metric((await client.get("/metrics")).text, 'maitred_warmups_total{outcome="done"}')

        assert await until(warmed) >= 1
        for pid in down:
            await step(client, pid)
            assert (await client.get(f"/v1/programs/{pid}")).json()["last_cached_tokens"] >= 6_000


async def test_a_handoff_consumer_is_warmed_with_the_prompt_the_handoff_announced(cluster):
    """LOCAL's API: a handoff that carries ``expected_prompt`` gets that text prefilled on the
    consumer's worker before the consumer asks, so its first request finds it cached. A handoff
    without one warms nothing (the program's last prompt is the producer's, not the consumer's)."""
    c = cluster(workers=1)
    planner = "planner notes " * 300
    coder = "you are the coder; the plan follows. " * 60 + planner

    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:

        async def ask(pid: str, prompt: str) -> dict[str, Any]:
            r = await client.post("/v1/completions", json={"model": "sim", "prompt": prompt, "max_tokens": 4, "program_id": pid})
            assert r.status_code == 200, r.text
            return r.json()["usage"]

        async def warmed() -> float:
            return c.metric((await client.get("/metrics")).text, 'maitred_warmups_total{outcome="done"}')

        for pid, announce in (("silent", False), ("h", True)):
            await ask(pid, planner)
            await client.post("/v1/events", json=[event("tool.start", pid, call_id="c1", tool="write_plan")])
            handoff = event("handoff", pid, from_agent="planner", to_agent="coder", context_tokens=600)
            if announce:
                handoff["expected_prompt"] = coder
            await client.post("/v1/events", json=[handoff])
            await client.post("/v1/events", json=[event("tool.end", pid, call_id="c1")])
            if not announce:  # nothing right to send: no warmup is admitted for it (a few steps pass)
                await asyncio.sleep(1.0)
                assert await warmed() == 0
        assert await until(warmed) >= 1
        usage = await ask("h", coder)
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0.9 * usage["prompt_tokens"], usage


async def test_a_new_programs_first_request_is_placed_when_it_arrives(cluster):
    """The policy's arrival rule (maitred's, as the replay applies it) places a new program that
    fits at once: its first request is not held for the step it would otherwise trigger."""
    c = cluster(workers=2)
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        for pid in ("fresh-1", "fresh-2", "fresh-3"):
            r = await client.post("/v1/chat/completions", json=chat(pid, [{"role": "user", "content": "hello " * 50}]))
            assert r.status_code == 200
        text = (await client.get("/metrics")).text
    assert c.metric(text, "maitred_queue_wait_seconds_count") == 3
    assert c.metric(text, 'maitred_queue_wait_seconds_bucket{le="0.001"}') == 3  # none held
    assert c.metric(text, 'maitred_assignments_total{reason="new"}') == 3


async def test_tool_statistics_are_seeded_from_the_store_at_start(cluster, db_url):
    from maitred.events import ToolEnd, ToolStart

    with SessionStore(db_url) as store:
        now = time.time() - 100
        store.write(
            [
                e
                for i in range(8)
                for e in (
                    ToolStart(ts=now + i, program_id="old", call_id=f"c{i}", tool="pytest"),
                    ToolEnd(ts=now + i + 2.0, program_id="old", call_id=f"c{i}", duration_s=2.0),
                )
            ]
        )
    c = cluster(workers=1, db_url=db_url)
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:

        async def seeded() -> dict[str, Any]:  # the store is opened off the event loop, then seeds
            tools = (await client.get("/v1/stats/tools")).json()["tools"]
            return {r["tool"]: r for r in tools if not r.get("signature") and r["n"]}

        rows = await until(seeded)
        assert rows["pytest"]["n"] == 8 and rows["pytest"]["mean_s"] == pytest.approx(2.0)
        await client.post("/v1/events", json=[event("tool.start", "new", call_id="c", tool="pytest")])
        info = (await client.get("/v1/programs/new")).json()
        assert info["readiness_source"] == "tool" and info["predicted_tool_end"] == pytest.approx(time.time() + 2.0, abs=1.0)


async def test_priorities_are_sent_and_only_ever_rise_for_a_cached_prefix(cluster):
    c = cluster(workers=1, runtime=replace(FAST, priority=True, priority_epoch_s=0.3))
    history = [{"role": "user", "content": "tok " * 300}]
    seen = []
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        for _ in range(4):
            r = await client.post("/v1/chat/completions", json=chat("pp", history))
            assert r.status_code == 200
            seen.append((await client.get("/v1/programs/pp")).json()["priority"])
            await asyncio.sleep(0.35)
    assert all(isinstance(p, int) for p in seen) and seen == sorted(seen) and seen[-1] > seen[0]


@pytest.mark.parametrize("store", ["down", "corrupt"])
async def test_a_store_that_is_down_or_unusable_never_stops_serving(cluster, tmp_path, store):
    if store == "down":
        url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing?connect_timeout=1"
    else:
        path = tmp_path / "not-a-database.db"
        path.write_bytes(b"this is not SQLite" * 100)
        url = f"sqlite:///{path}"
    c = cluster(workers=1, db_url=url)
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        for step in range(3):
            r = await client.post("/v1/chat/completions", json=chat("p", [{"role": "user", "content": f"step {step}"}]))
            assert r.status_code == 200
        r = await client.post("/v1/events", json=[event("tool.start", "p", call_id="c", tool="grep")])
        assert r.status_code == 200 and r.json()["accepted"] == 1
        assert (await client.get("/v1/programs/p")).json()["phase"] == "acting"
        health = await client.get("/healthz")
        if store == "down":  # history waits for it: the gateway is healthy and says the store is retrying
            assert health.status_code == 200 and health.json()["status"] == "ok"
            assert health.json()["store"].startswith("unavailable, retrying: database unavailable")
        else:  # history is being lost: not green, saying why
            assert health.status_code == 503 and health.json()["status"].startswith("cannot use the store: database is corrupt")
        if store == "corrupt":

            async def dropped() -> float:
                return c.metric((await client.get("/metrics")).text, "maitred_dropped_events_total")

            assert await until(dropped) >= 1


def test_admission_estimates_learn_each_programs_characters_per_token():
    from maitred.gateway.loop import LiveDriver
    from maitred.gateway.usage import PromptSize, prompt_size

    runtime = LiveDriver({})
    size = prompt_size({"messages": [{"role": "user", "content": "x" * 984}]})
    assert size == PromptSize(chars=1000) and runtime.estimate_prompt("p", size) == 250  # 4 characters a token
    runtime.completed(
        "p",
        request_id="r",
        worker="w",
        prompt_tokens=100,
        completion_tokens=5,
        cached_tokens=None,
        ttft_s=None,
        ok=True,
        store=False,
        size=size,
    )  # this program: 10 a token
    assert runtime.estimate_prompt("p", PromptSize(chars=3000)) == 300
    assert runtime.estimate_prompt("other", PromptSize(chars=3000)) == 750
    assert runtime.estimate_prompt("p", prompt_size({"input_ids": [1, 2, 3]})) == 3


async def test_a_model_request_sent_twice_under_one_balancer_request_id_is_one_model_call_in_the_store(cluster, tmp_path):
    """``X-Maitred-Request-Id`` (``examples/haproxy-standby.cfg`` sets one per client request and
    keeps it on retries) is the call's request id: a request the balancer sends again is stored
    once. One that is no id is refused naming the header."""
    db_url = f"sqlite:///{tmp_path / 'm.db'}"
    c = cluster(workers=1, db_url=db_url)
    async with httpx.AsyncClient(base_url=c.url, timeout=60) as client:
        body = chat("p-retried", [{"role": "user", "content": "hi"}])
        for _ in range(2):
            r = await client.post("/v1/chat/completions", json=body, headers={"X-Maitred-Request-Id": "b1f0-42"})
            assert r.status_code == 200, r.text
        bad = await client.post("/v1/chat/completions", json=body, headers={"X-Maitred-Request-Id": "no spaces"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "x-maitred-request-id", bad.text
    with SessionStore(db_url) as store:
        ends = await until(lambda: [e for e in store.events("p-retried") if e["type"] == "llm.end"])
        assert {e["request_id"] for e in ends} == {"gw-b1f0-42"}
        assert store.programs()[0].llm_calls == 1
