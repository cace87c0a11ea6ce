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

With ``--standby --db postgresql+psycopg://...``: two shards, each a holder and a standby
(``maitred serve --shard``, ``--standby-hold``) on its two workers and its own schema there,
behind ``examples/haproxy-standby.cfg``; every program posts a tool call's two events after
each model call, and once half the model calls are answered the first shard's holder is killed
with SIGKILL. Figures: client errors (goal 0), the takeover as that shard's programs saw it (the
longest gap between two of their answered calls from the kill on, and their slowest call),
stickiness, and model calls and events stored against those answered.

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
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from reference import reference_s

from maitred.flags import positive, whole

sys.path.insert(0, str(Path(__file__).parents[1]))  # the scale tests' harness, one copy of it
from tests.helpers import throwaway_schemas, wait_until
from tests.scale.harness import PairedShard, Sharded, balancer_binary, start_paired_sharded, start_sharded


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


@dataclass
class Takeover:
    """What the programs saw of a holder killed mid-run: each answered call's (program, end
    time), every failure, and when the kill came."""

    answered: list[tuple[str, float]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    events_answered: int = 0
    latencies: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # pid: (end, seconds)
    killed_at: float | None = None


async def drive_takeover(url: str, args: argparse.Namespace, kill: Callable[[], None]) -> Takeover:
    """Every program's ``--steps`` model calls, each followed by its tool call's two events,
    ``--concurrency`` programs at a time; ``kill`` once half the model calls are answered."""
    seen = Takeover()
    half = args.programs * args.steps // 2
    gate = asyncio.Semaphore(args.concurrency)

    async def post(client: httpx.AsyncClient, path: str, body: Any, pid: str, what: str) -> bool:
        """POST ``body`` as program ``pid``; a failure or a non-200 answer is noted as a problem."""
        try:
            r = await client.post(url + path, json=body, headers={"x-program-id": pid})
        except httpx.HTTPError as exc:
            seen.problems.append(f"{pid} {what}: {type(exc).__name__}: {exc}")
            return False
        if r.status_code != 200:
            seen.problems.append(f"{pid} {what}: {r.status_code} {r.text[:200]}")
            return False
        return True

    async def call(client: httpx.AsyncClient, pid: str, step: int) -> None:
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"step {step} of {pid}"}]}
        started = time.perf_counter()
        if not await post(client, "/v1/chat/completions", body, pid, f"call {step}"):
            return
        now = time.perf_counter()
        seen.answered.append((pid, now))
        seen.latencies.setdefault(pid, []).append((now, now - started))
        if len(seen.answered) == half and seen.killed_at is None:
            kill()
            seen.killed_at = time.perf_counter()

    async def events(client: httpx.AsyncClient, pid: str, step: int) -> None:
        now, call_id = time.time(), f"{pid}-{step}"
        batch = [
            {"type": "tool.start", "ts": now, "program_id": pid, "call_id": call_id, "tool": "pytest"},
            {"type": "tool.end", "ts": now + 0.001, "program_id": pid, "call_id": call_id, "status": "ok"},
        ]
        if await post(client, "/v1/events", batch, pid, f"events {step}"):
            seen.events_answered += len(batch)

    async def program(client: httpx.AsyncClient, pid: str) -> None:
        async with gate:
            for step in range(args.steps):
                await call(client, pid, step)
                await events(client, pid, step)

    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(program(client, f"bench-{i:05d}") for i in range(args.programs)))
    return seen


def run_standby(args: argparse.Namespace) -> dict[str, Any]:
    """Two shards of a holder and a standby each; the first shard's holder killed mid-run."""
    with tempfile.TemporaryDirectory(prefix="maitred-bench-standby-") as root, ExitStack() as stack:
        schema_url = stack.enter_context(throwaway_schemas(args.db, "bench_standby"))
        sharded = start_paired_sharded(2, schema_url, Path(root), stack, time_scale=args.time_scale)
        victim = sharded.shards[0]
        assert isinstance(victim, PairedShard)
        holder, [standby] = victim.pair.holder(), victim.pair.standbys()
        started = time.perf_counter()
        seen = asyncio.run(drive_takeover(sharded.balancer.url, args, holder.proc.kill))
        seconds = time.perf_counter() - started
        sticky = stickiness(sharded, args.programs, args.steps)
        placed = sharded.placement()
        killed = seen.killed_at or 0.0
        theirs = sorted(t for pid, t in seen.answered if victim.name in placed.get(pid, {}))
        gap = max((b - a for a, b in zip(theirs, theirs[1:]) if b >= killed), default=None)
        slowest = max(
            (s for pid, calls in seen.latencies.items() if victim.name in placed.get(pid, {}) for _, s in calls), default=0.0
        )
        return {
            "shards": 2,
            "programs": args.programs,
            "calls": args.programs * args.steps,
            "client_errors": len(seen.problems),
            "first_errors": seen.problems[:5],
            "seconds": round(seconds, 1),
            "standby_took_over": victim.pair.holder() is standby,
            "takeover_gap_s": None if gap is None else round(gap, 3),
            "victim_slowest_call_s": round(slowest, 3),
            "model_calls_answered": len(seen.answered),
            "model_calls_stored": sum(n for homes in placed.values() for _, n in homes.values()),
            "events_answered": seen.events_answered,
            "events_stored": 2 * sum(t for homes in placed.values() for t, _ in homes.values()),
            **sticky,
        }


def _shard_counts(text: str) -> list[int]:
    """``--shards``: comma-separated counts, each 1 to 16 (every shard is three processes here)."""
    count = whole(1, 16)
    return [count(part.strip()) for part in text.split(",") if part.strip()] or [count("")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=_shard_counts, default="2,3,4", help="shard counts to run, comma-separated")
    parser.add_argument("--programs", type=whole(1, 100_000), default=200)
    parser.add_argument("--steps", type=whole(1, 1_000), default=5, help="model calls per program")
    parser.add_argument("--concurrency", type=whole(1, 10_000), default=32, help="programs calling at once")
    parser.add_argument("--time-scale", type=positive(), default=1000.0, help="simulated workers run this much faster than a GPU")
    parser.add_argument("--standby", action="store_true", help="two shards of a holder and a standby; a holder killed mid-run")
    parser.add_argument("--db", help="with --standby: a PostgreSQL URL; the run uses schemas of its own there, dropped after")
    args = parser.parse_args()
    if balancer_binary("haproxy") is None:
        raise SystemExit("haproxy is not installed (apt-get install haproxy)")
    if args.standby != bool(args.db):
        parser.error("--standby and --db: give both (the standbys keep their lease and history in PostgreSQL) or neither")
    result: dict[str, Any] = {"cores": os.cpu_count(), "reference_s": reference_s(), "programs": args.programs}
    if args.standby:
        result["standby"] = run_standby(args)
        result["load_1m"] = round(os.getloadavg()[0], 2)
        row = result["standby"]
        print(
            f"holder killed: {row['client_errors']} client errors, gap {row['takeover_gap_s']} s, "
            f"sticky {row['sticky_share']}, model calls {row['model_calls_stored']}/{row['model_calls_answered']}, "
            f"events {row['events_stored']}/{row['events_answered']} stored/answered",
            file=sys.stderr,
        )
        print(json.dumps(result))
        return
    result["runs"] = [run(count, args) for count in args.shards]
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
