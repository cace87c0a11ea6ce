"""Gateway overhead: added latency and requests/s against calling the worker directly and
against sglang-router (cache_aware) in front of the same simulated workers, in one run.

Everything runs as separate processes on 127.0.0.1: two simulated SGLang workers (``python -m
maitred.sim.worker.config``, time-scaled so a request costs the worker almost nothing),
the gateway (``python -m maitred.gateway.serve``, no store) and, when the
``sglang-router`` package is installed, ``python -m sglang_router.launch_router --policy
cache_aware``, timed only once its ``GET /workers`` shows both workers healthy.

- Added latency: one request at a time, the three targets interleaved (direct, gateway,
  router) so drift in machine load hits them alike; added = p50/p99 of a target minus the
  direct one's. Requests carry a program id (stable set of programs) to the gateway.
- Requests/s: closed loop, ``--concurrency`` clients for ``--duration`` seconds per target.
- Streaming: time to first byte via the gateway vs direct.
- A burst of new programs: ``--streams`` (and ``--burst-large``) concurrent streaming requests of
  new programs at once, each placed by the policy's arrival rule or held until a step places
  it: how many completed, how many were refused and with which status, how many times a
  healthy worker was declared down (the event loop must keep answering health checks), and
  that the gateway's requests in flight, held and asyncio tasks are back to where they were.
- A new program's first request at 0, 1,000 and 10,000 programs known (each with an open tool
  call, ticking every second), on fresh workers and a fresh gateway: its added latency must not grow
  with the fleet (goal: at most 1.5× at 10,000 what it is at 0), then the added latency of
  known programs at 10,000.
- ``reference_s``: a fixed pure-Python workload timed in the same run (``benchmarks/reference.py``).

Last line: one JSON object with every figure.
"""

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from contextlib import ExitStack
from typing import Any

import httpx
import numpy as np
from peers import router_installed, spawn, start_router
from reference import reference_s

from maitred.harness.background import free_port, wait_http

BODY = {"model": "sim", "messages": [{"role": "user", "content": "ping " * 20}], "max_tokens": 1}


def start_workers(stack: ExitStack, n: int, time_scale: float) -> list[str]:
    urls = []
    for _ in range(n):
        port = free_port()
        proc = spawn(
            stack,
            [
                sys.executable,
                "-m",
                "maitred.sim.worker",
                "--port",
                str(port),
                "--gpu-tokens",
                "2000000",
                "--time-scale",
                str(time_scale),
            ],
        )
        urls.append(f"http://127.0.0.1:{port}")
        wait_http(urls[-1] + "/health", timeout_s=60, process=proc)
    return urls


def start_gateway(stack: ExitStack, workers: list[str]) -> str:
    port = free_port()
    argv = [sys.executable, "-m", "maitred.gateway.serve", "--port", str(port), "--no-db", "--log-level", "warning"]
    for url in workers:
        argv += ["--worker", url]
    proc = spawn(stack, argv)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", timeout_s=60, process=proc)
    return url


def body_for(target: str, i: int, programs: int) -> dict[str, Any]:
    return {**BODY, "program_id": f"bench-{i % programs}"} if target == "gateway" else dict(BODY)


def latencies(urls: dict[str, str], n: int, programs: int) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Milliseconds per request for each target, and per target how many requests did not
    answer within 30 s (counted and left out of the figures, not fatal: the JSON says so)."""
    out: dict[str, list[float]] = {name: [] for name in urls}
    timed_out = dict.fromkeys(urls, 0)
    with httpx.Client(timeout=30) as client:
        for name, url in urls.items():  # warm connections and caches
            for i in range(50):
                client.post(url + "/v1/chat/completions", json=body_for(name, i, programs)).raise_for_status()
        for i in range(n):
            for name, url in urls.items():
                body = body_for(name, i, programs)
                started = time.perf_counter()
                try:
                    client.post(url + "/v1/chat/completions", json=body).raise_for_status()
                except httpx.TimeoutException:
                    timed_out[name] += 1
                    print(f"{name}: request {i} did not answer within 30 s", file=sys.stderr)
                    continue
                out[name].append(time.perf_counter() - started)
    return {name: np.array(values) * 1000 for name, values in out.items()}, timed_out


async def throughput(url: str, target: str, concurrency: int, duration_s: float, programs: int) -> float:
    done = 0
    stop_at = time.perf_counter() + duration_s
    limits = httpx.Limits(max_connections=concurrency)

    async def client_loop(client: httpx.AsyncClient, k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < stop_at:
            r = await client.post("/v1/chat/completions", json=body_for(target, i, programs))
            r.raise_for_status()
            done += 1
            i += concurrency

    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(client_loop(client, k) for k in range(concurrency)))
        return done / (time.perf_counter() - started)


def ttfb(urls: dict[str, str], n: int) -> dict[str, float]:
    out: dict[str, list[float]] = {name: [] for name in urls}
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            for name, url in urls.items():
                body = {**body_for(name, i, 16), "stream": True, "max_tokens": 8}
                started = time.perf_counter()
                with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    for i, _ in enumerate(r.iter_raw()):
                        if i == 0:
                            out[name].append(time.perf_counter() - started)
    return {name: statistics.median(v) * 1000 for name, v in out.items()}


def _metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def burst(url: str, n: int, tag: str) -> dict[str, Any]:
    """``n`` new programs' streams at once; every one must complete or be refused with a clear status."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        before = (await client.get("/healthz")).json()
        failures_before = _metric_sum((await client.get("/metrics")).text, "maitred_worker_failures_total")

        async def one(i: int) -> str:
            body = {**BODY, "program_id": f"{tag}-{i}", "stream": True, "max_tokens": 4}
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    data = await r.aread()
                    return (
                        "completed" if r.status_code == 200 and data.endswith(b"data: [DONE]\n\n") else f"status_{r.status_code}"
                    )
            except httpx.HTTPError as exc:
                return type(exc).__name__

        started = time.perf_counter()
        outcomes = await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - started
        metrics = (await client.get("/metrics")).text
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        deadline = time.monotonic() + 30
        while True:
            after = (await client.get("/healthz")).json()
            settled = after["requests_in_flight"] == 0 and after["requests_held"] == 0 and after["tasks"] <= before["tasks"]
            if settled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome] = counts.get(outcome, 0) + 1
    return {
        "streams": n,
        "completed": counts.pop("completed", 0),
        "refused": counts,
        "seconds": round(elapsed, 2),
        "workers_declared_down": int(_metric_sum(metrics, "maitred_worker_failures_total") - failures_before),
        "left_in_flight": after["requests_in_flight"],
        "left_held": after["requests_held"],
        "tasks_before": before["tasks"],
        "tasks_after": after["tasks"],
    }


def first_requests(gateway: str, direct: str, n: int, tag: str) -> tuple[float, int]:
    """Median added ms of a new program's first request (a fresh program id each time),
    interleaved with the same request sent to the worker directly, and how many of the
    gateway's did not answer within 60 s (counted, not fatal: the figure says so)."""
    gw, dr, timed_out = [], [], 0
    with httpx.Client(timeout=60) as client:
        for i in range(n):
            started = time.perf_counter()
            client.post(direct + "/v1/chat/completions", json=BODY).raise_for_status()
            dr.append(time.perf_counter() - started)
            started = time.perf_counter()
            try:
                client.post(gateway + "/v1/chat/completions", json={**BODY, "program_id": f"{tag}-{i}"}).raise_for_status()
            except httpx.TimeoutException:
                timed_out += 1
                continue
            gw.append(time.perf_counter() - started)
    return (statistics.median(gw) - statistics.median(dr)) * 1000 if gw else math.nan, timed_out


def load_programs(url: str, n: int, first: int = 0) -> None:
    now = time.time()
    lines = []
    for i in range(first, first + n):
        pid = f"bulk-{i}"
        lines.append({"type": "program.start", "ts": now, "program_id": pid, "agent": "coder"})
        lines.append({"type": "llm.start", "ts": now, "program_id": pid, "request_id": "r0", "prompt_tokens": 1000 + i % 5000})
        lines.append(
            {
                "type": "llm.end",
                "ts": now + 1,
                "program_id": pid,
                "request_id": "r0",
                "prompt_tokens": 1000 + i % 5000,
                "completion_tokens": 50,
            }
        )
        lines.append({"type": "tool.start", "ts": now + 1, "program_id": pid, "call_id": "c0", "tool": "pytest"})
    for k in range(0, len(lines), 10_000):
        body = "\n".join(json.dumps(e) for e in lines[k : k + 10_000])
        r = httpx.post(url + "/v1/events", content=body, headers={"content-type": "application/x-ndjson"}, timeout=60)
        r.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per target for latency")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of closed-loop load per target")
    parser.add_argument("--programs", type=int, default=100, help="distinct program ids sent to the gateway")
    parser.add_argument("--streams", type=int, default=1000, help="new programs' concurrent streams in the burst")
    parser.add_argument("--burst-large", type=int, default=5000, help="a second, larger burst (0: none)")
    parser.add_argument("--first", type=int, default=300, help="new programs' first requests timed per fleet size")
    parser.add_argument("--time-scale", type=float, default=1000.0, help="simulated workers run this much faster than a GPU")
    args = parser.parse_args()

    result: dict[str, Any] = {"cores": os.cpu_count(), "reference_s": reference_s()}
    with ExitStack() as stack:
        workers = start_workers(stack, 2, args.time_scale)
        gateway = start_gateway(stack, workers)
        router = start_router(stack, workers)[0] if router_installed() else None
        urls = {"direct": workers[0], "gateway": gateway}
        if router:
            urls["sglang_router"] = router
        lat, result["latency_timed_out"] = latencies(urls, args.requests, args.programs)
        for name, values in lat.items():
            print(f"{name:14s} p50 {np.percentile(values, 50):.3f} ms  p99 {np.percentile(values, 99):.3f} ms", file=sys.stderr)
        base50, base99 = np.percentile(lat["direct"], 50), np.percentile(lat["direct"], 99)
        result["direct_ms_p50"] = round(float(base50), 3)
        result["added_ms_p50"] = round(float(np.percentile(lat["gateway"], 50) - base50), 3)
        result["added_ms_p99"] = round(float(np.percentile(lat["gateway"], 99) - base99), 3)
        if router:
            result["sglang_router_added_ms_p50"] = round(float(np.percentile(lat["sglang_router"], 50) - base50), 3)
            result["sglang_router_added_ms_p99"] = round(float(np.percentile(lat["sglang_router"], 99) - base99), 3)
        rps = {
            name: asyncio.run(throughput(url, name, args.concurrency, args.duration, args.programs)) for name, url in urls.items()
        }
        print("requests/s: " + ", ".join(f"{k} {v:.0f}" for k, v in rps.items()), file=sys.stderr)
        result["direct_requests_per_s"] = round(rps["direct"], 1)
        result["requests_per_s"] = round(rps["gateway"], 1)
        if router:
            result["sglang_router_requests_per_s"] = round(rps["sglang_router"], 1)
            result["requests_per_s_vs_sglang_router"] = round(rps["gateway"] / rps["sglang_router"], 3)
        ttfbs = ttfb({"direct": workers[0], "gateway": gateway}, 200)
        result["stream_ttfb_ms_direct_p50"] = round(ttfbs["direct"], 3)
        result["stream_ttfb_ms_gateway_p50"] = round(ttfbs["gateway"], 3)
        result["burst"] = asyncio.run(burst(gateway, args.streams, "burst"))
        print(f"burst: {result['burst']}", file=sys.stderr)
        if args.burst_large:
            result["burst_large"] = asyncio.run(burst(gateway, args.burst_large, "burst-large"))
            print(f"large burst: {result['burst_large']}", file=sys.stderr)
        first: dict[str, float] = {}
        known = 0
        # fresh workers and a fresh gateway: exactly 0, 1,000, 10,000 programs known, and workers
        # not still digesting the bursts' 6,000 streams
        workers = start_workers(stack, 2, args.time_scale)
        fleet = start_gateway(stack, workers)
        for size in (0, 1_000, 10_000):
            load_programs(fleet, size - known, first=known)
            known = size
            time.sleep(2.0)  # a few periodic ticks over them
            result.setdefault("first_request_programs_known", []).append(httpx.get(fleet + "/healthz").json()["programs"])
            added, timed_out = first_requests(fleet, workers[0], args.first, f"first-{size}")
            first[str(size)] = round(added, 3)
            result.setdefault("first_request_timed_out", []).append(timed_out)
        print(f"first request, added ms by programs known: {first}", file=sys.stderr)
        result["first_request_added_ms"] = first
        result["first_request_ratio_10k_vs_0"] = round(first["10000"] / first["0"], 3) if first["0"] > 0 else None
        lat10k, result["latency_timed_out_10k_programs"] = latencies(
            {"direct": workers[0], "gateway": fleet}, max(args.requests // 2, 200), args.programs
        )
        result["programs_in_state"] = httpx.get(fleet + "/healthz").json()["programs"]
        result["added_ms_p50_10k_programs"] = round(
            float(np.percentile(lat10k["gateway"], 50) - np.percentile(lat10k["direct"], 50)), 3
        )
        result["added_ms_p99_10k_programs"] = round(
            float(np.percentile(lat10k["gateway"], 99) - np.percentile(lat10k["direct"], 99)), 3
        )
        ticks = httpx.get(fleet + "/metrics").text
        count = sum(
            float(line.rsplit(" ", 1)[1])
            for line in ticks.splitlines()
            if line.startswith("maitred_scheduler_tick_seconds_count")
        )
        total = sum(
            float(line.rsplit(" ", 1)[1]) for line in ticks.splitlines() if line.startswith("maitred_scheduler_tick_seconds_sum")
        )
        result["scheduler_ticks"] = int(count)
        result["scheduler_tick_ms_mean"] = round(total / count * 1000, 2) if count else None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
