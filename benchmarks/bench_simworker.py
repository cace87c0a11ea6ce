"""How fast the simulated SGLang worker answers, and how closely it keeps the engine model's time.

    python benchmarks/bench_simworker.py [--requests 2000] [--concurrency 16]

Starts ``maitred sim-worker`` as its own process (so the client does not share its interpreter)
and measures, over loopback:

- throughput: chat requests/s at ``--concurrency``, programs of 20 steps each, with
  ``--time-scale 10000`` so the engine's own time is negligible: the ceiling the double puts on
  any gateway benchmark run against it;
- timing fidelity: at ``--time-scale 1``, wall-clock latency of ``/generate`` requests against
  the engine time the worker reports (``meta_info.e2e_latency``): the median overhead in ms and
  the median ratio wall / engine (1.0 is perfect);
- ``--streams`` concurrent streaming chat requests (50 tokens each, ``--time-scale 10``): how
  many complete, in how long.

Last line: one JSON object.
"""

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
from reference import reference_s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(port: int, time_scale: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
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
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("sim-worker did not start")
        time.sleep(0.1)


async def throughput(url: str, requests: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    programs = requests // 20

    async def program(client: httpx.AsyncClient, i: int, gate: asyncio.Semaphore) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a coding agent. " * 50},
            {"role": "user", "content": f"task {i}: " + "detail " * 200},
        ]
        for step in range(20):
            async with gate:
                began = time.perf_counter()
                r = await client.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 50})
                latencies.append(time.perf_counter() - began)
            r.raise_for_status()
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"tool output {step} " * 30}]

    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        began = time.perf_counter()
        await asyncio.gather(*(program(client, i, gate) for i in range(programs)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": 1e3 * latencies[len(latencies) // 2],
        "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)],
    }


async def streams(url: str, n: int) -> dict[str, float]:
    async def one(client: httpx.AsyncClient, i: int) -> bool:
        body = {"messages": [{"role": "user", "content": f"request {i} " + "x " * 100}], "max_tokens": 50, "stream": True}
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        return lines[-1] == "data: [DONE]"

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=n + 10)) as client:
        began = time.perf_counter()
        done = await asyncio.gather(*(one(client, i) for i in range(n)))
        return {"streams": n, "streams_completed": sum(done), "streams_s": time.perf_counter() - began}


def fidelity(url: str, samples: int = 30) -> dict[str, float]:
    overheads, ratios, engines = [], [], []
    with httpx.Client(timeout=60) as client:
        for i in range(samples):
            body = {"text": f"sample {i} " + "word " * 4000, "sampling_params": {"max_new_tokens": 64}}
            began = time.perf_counter()
            r = client.post(url + "/generate", json=body)
            wall = time.perf_counter() - began
            engine = r.json()["meta_info"]["e2e_latency"]
            overheads.append(wall - engine)
            ratios.append(wall / engine)
            engines.append(engine)
    return {
        "fidelity_engine_ms_p50": 1e3 * statistics.median(engines),
        "fidelity_overhead_ms_p50": 1e3 * statistics.median(overheads),
        "fidelity_wall_over_engine_p50": statistics.median(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--streams", type=int, default=1000)
    args = parser.parse_args()
    figures: dict[str, Any] = {"concurrency": args.concurrency}
    for scale, measure in ((10_000.0, "throughput"), (1.0, "fidelity"), (10.0, "streams")):
        port = free_port()
        proc = start(port, scale)
        try:
            url = f"http://127.0.0.1:{port}"
            if measure == "throughput":
                figures.update(asyncio.run(throughput(url, args.requests, args.concurrency)))
            elif measure == "fidelity":
                figures.update(fidelity(url))
            else:
                figures.update(asyncio.run(streams(url, args.streams)))
        finally:
            proc.terminate()
            proc.wait(30)
    figures["reference_s"] = reference_s()
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
