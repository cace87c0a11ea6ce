"""Shards behind HAProxy: how well programs stick to one shard and what the balancer carries.

For each shard count in ``--shards`` (2 to 4 by default): that many ``maitred serve`` processes,
each with two simulated SGLang workers and its own SQLite store, behind HAProxy running
``examples/haproxy.cfg`` with only its ports changed (the scale tests' harness,
``tests/scale/harness.py``, so one copy of it). ``--programs`` programs then make ``--steps``
model calls each with their ``X-Program-Id``, ``--concurrency`` calls at a time through the
balancer, in a closed loop.

- Stickiness: from each shard's store, the share of programs whose calls all landed on one shard
  (consistent hashing promises 1.0), and the programs each shard got.
- Throughput: model calls per second through the balancer, and their latency p50 / p99.
- ``reference_s``: a fixed pure-Python workload timed in the same run (``benchmarks/reference.py``).

Everything, the load generator included, shares this machine's cores: compare figures within one
run. Last line: one JSON object with every figure.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from reference import reference_s

sys.path.insert(0, str(Path(__file__).parents[1]))  # the scale tests' harness, one copy of it
from tests.helpers import wait_until
from tests.scale.harness import Sharded, balancer_binary, start_sharded


async def drive(url: str, programs: int, steps: int, concurrency: int) -> tuple[float, list[float], int]:
    """Every program's calls in order, ``concurrency`` programs at a time: (seconds, each
    call's latency, calls that failed)."""
    latencies: list[float] = []
    failed = 0
    gate = asyncio.Semaphore(concurrency)

    async def program(client: httpx.AsyncClient, pid: str) -> None:
        nonlocal failed
        async with gate:
            for step in range(steps):
                body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"step {step} of {pid}"}]}
                started = time.perf_counter()
                r = await client.post(url + "/v1/chat/completions", json=body, headers={"x-program-id": pid})
                latencies.append(time.perf_counter() - started)
                failed += r.status_code != 200

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(program(client, f"bench-{i:05d}") for i in range(programs)))
        return time.perf_counter() - started, latencies, failed


def stickiness(sharded: Sharded, programs: int, steps: int) -> dict[str, Any]:
    """Where each program's calls were stored, once every call is (a shard writes its history a
    moment after answering)."""
    expected = programs * steps
    stored = wait_until(lambda: sum(n for s in sharded.placement().values() for _, n in s.values()) >= expected, timeout=120)
    placed = sharded.placement()
    per_shard = {s.name: sum(1 for homes in placed.values() if s.name in homes) for s in sharded.shards}
    return {
        "calls_stored": sum(n for homes in placed.values() for _, n in homes.values()),
        "all_stored": stored,
        "sticky_share": round(sum(1 for homes in placed.values() if len(homes) == 1) / max(1, len(placed)), 4),
        "programs_per_shard": per_shard,
    }


def run(count: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="maitred-bench-shards-") as root, ExitStack() as stack:
        sharded = start_sharded("haproxy", count, Path(root), stack, time_scale=args.time_scale)
        seconds, latencies, failed = asyncio.run(drive(sharded.balancer.url, args.programs, args.steps, args.concurrency))
        cut = statistics.quantiles(latencies, n=100)
        return {
            "shards": count,
            "calls": len(latencies),
            "failed": failed,
            "calls_per_s": round(len(latencies) / seconds, 1),
            "latency_ms_p50": round(1000 * statistics.median(latencies), 2),
            "latency_ms_p99": round(1000 * cut[98], 2),
            **stickiness(sharded, args.programs, args.steps),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="2,3,4", help="shard counts to run, comma-separated")
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5, help="model calls per program")
    parser.add_argument("--concurrency", type=int, default=32, help="programs calling at once")
    parser.add_argument("--time-scale", type=float, default=1000.0, help="simulated workers run this much faster than a GPU")
    args = parser.parse_args()
    if balancer_binary("haproxy") is None:
        raise SystemExit("haproxy is not installed (apt-get install haproxy)")
    result: dict[str, Any] = {"cores": os.cpu_count(), "reference_s": reference_s(), "programs": args.programs}
    result["runs"] = [run(int(count), args) for count in args.shards.split(",")]
    for row in result["runs"]:
        print(
            f"{row['shards']} shards: {row['calls_per_s']} calls/s, p50 {row['latency_ms_p50']} ms, "
            f"p99 {row['latency_ms_p99']} ms, {row['failed']} failed; sticky {row['sticky_share']}, "
            f"programs per shard {row['programs_per_shard']}",
            file=sys.stderr,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
