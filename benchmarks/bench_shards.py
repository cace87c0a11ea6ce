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

With ``--kill-shard``: at each shard count (2 or more), the programs are conversations (each
call sends the whole history, ``tests/scale/conversations.py``); once every program has made
half its ``--steps`` calls, the first shard is killed outright, its gateway and its workers
(SIGKILL, no standby), and the programs make the rest. Figures: from the simulated workers' own
report of each call's cached prompt tokens, the recomputes (a call served with fewer cached
tokens than its previous prompt had) of each program that was on the killed shard (goal: 1
each, its first call on its new shard) and of every other program (goal: 0), the programs whose
later calls were served by more than one shard or worker (goal: 0, read from the survivors'
stores), the tokens each moved program recomputed, and client errors (goal: 0).

With ``--hop``: one shard, the same load (``--programs``, ``--steps``, ``--concurrency``)
straight to it and through HAProxy in front of it, the two taking turns ``--passes`` times:
calls/s and latency p50 / p99 of each, and what the balancer adds. With ``--store-wait --db
postgresql+psycopg://...``: two gateways side by side, each on two workers of its own and a
schema of its own on that PostgreSQL, one plain and one with ``--shard`` (every answer waits
until its history is written), the same load straight to each, taking turns likewise: what
waiting for the store adds to each answer.

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
from maitred.harness.background import free_port, wait_http

sys.path.insert(0, str(Path(__file__).parents[1]))  # the scale tests' harness, one copy of it
from tests.helpers import throwaway_schemas, wait_until
from tests.scale.conversations import Conversations, answered_by
from tests.scale.harness import (
    PairedShard,
    Process,
    Shard,
    Sharded,
    balancer_binary,
    maitred_command,
    start_paired_sharded,
    start_sharded,
    start_workers,
)


async def drive(url: str, programs: int, steps: int, concurrency: int, prefix: str = "bench") -> tuple[float, list[float], int]:
    """Every program's calls in order, ``concurrency`` programs at a time: (seconds, each
    call's latency, calls that failed). Program ids are ``PREFIX-NNNNN``."""
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
        await asyncio.gather(*(program(client, f"{prefix}-{i:05d}") for i in range(programs)))
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


def _figures(passes: list[tuple[float, list[float], int]]) -> dict[str, Any]:
    """calls/s, latency p50 / p99 and failures over the passes of one mode of a comparison."""
    latencies = [x for _, lat, _ in passes for x in lat]
    cut = statistics.quantiles(latencies, n=100)
    return {
        "calls": len(latencies),
        "failed": sum(f for _, _, f in passes),
        "calls_per_s": round(len(latencies) / sum(s for s, _, _ in passes), 1),
        "latency_ms_p50": round(1000 * statistics.median(latencies), 2),
        "latency_ms_p99": round(1000 * cut[98], 2),
    }


def compare(modes: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """The same load through each of ``modes`` (name: URL), after one uncounted call of every
    program through each, the modes taking turns for ``--passes`` rounds (fresh programs every
    pass), so a change of the machine's load during
    the run weighs on each alike; figures by mode, and the latency each adds to the first."""
    passes: dict[str, list[tuple[float, list[float], int]]] = {name: [] for name in modes}
    for name, url in modes.items():  # a pass of each not counted: connections, imports, first programs
        asyncio.run(drive(url, args.programs, 1, args.concurrency, f"warm-{name}"))
    for n in range(args.passes):
        for name, url in modes.items():
            passes[name].append(asyncio.run(drive(url, args.programs, args.steps, args.concurrency, f"{name}{n}")))
    out = {name: _figures(found) for name, found in passes.items()}
    base = next(iter(out.values()))
    for row in list(out.values())[1:]:
        row["added_ms_p50"] = round(row["latency_ms_p50"] - base["latency_ms_p50"], 2)
        row["added_ms_p99"] = round(row["latency_ms_p99"] - base["latency_ms_p99"], 2)
    return out


def run_hop(args: argparse.Namespace) -> dict[str, Any]:
    """One shard, the same load straight to it and through HAProxy in front of it."""
    with tempfile.TemporaryDirectory(prefix="maitred-bench-hop-") as root, ExitStack() as stack:
        sharded = start_sharded("haproxy", 1, Path(root), stack, time_scale=args.time_scale)
        shard = sharded.shards[0]
        assert isinstance(shard, Shard)
        return compare({"direct": shard.url, "haproxy": sharded.balancer.url}, args)


def run_store_wait(args: argparse.Namespace) -> dict[str, Any]:
    """One gateway on two workers and a PostgreSQL schema of its own, without and with
    ``--shard`` (every answer waits until its history is in the store), the same load straight to
    each; the two gateways run side by side on workers of their own, so they take turns alike."""
    with tempfile.TemporaryDirectory(prefix="maitred-bench-storewait-") as root, ExitStack() as stack:
        schema_url = stack.enter_context(throwaway_schemas(args.db, "bench_storewait"))
        plans = start_workers(2, Path(root), stack, time_scale=args.time_scale)
        urls = {}
        for (name, extra), (ports, _) in zip([("plain", []), ("shard", ["--shard", "s1"])], plans):
            port = free_port()
            argv = maitred_command("serve", "--port", str(port), "--db", schema_url(), "--tick", "0.2", "--log-level", "warning")
            argv += [*extra, *(a for p in ports for a in ("--worker", f"http://127.0.0.1:{p}"))]
            gateway = Process(argv, Path(root) / f"{name}-serve.log")
            stack.callback(gateway.stop)
            urls[name] = f"http://127.0.0.1:{port}"
            wait_http(urls[name] + "/healthz", timeout_s=120, process=gateway.proc)
        return compare(urls, args)


def run_kill(count: int, args: argparse.Namespace) -> dict[str, Any]:
    """``count`` shards; the first killed outright once every program made half its calls."""
    with tempfile.TemporaryDirectory(prefix="maitred-bench-shardloss-") as root, ExitStack() as stack:
        sharded = start_sharded("haproxy", count, Path(root), stack, time_scale=args.time_scale)
        convs = Conversations([f"bench-{i:05d}" for i in range(args.programs)])
        before = max(1, args.steps // 2)
        problems = convs.run(sharded.balancer.url, before, args.concurrency)
        served = answered_by(sharded, convs, timeout_s=120)
        victim = sharded.shards[0]
        assert isinstance(victim, Shard)
        moved = {pid for pid in convs.program_ids if served[f"{pid}.0"].shard == victim.name}
        victim.kill()
        problems += convs.run(sharded.balancer.url, args.steps - before, args.concurrency)
        served = answered_by(sharded, convs, timeout_s=120)
        after = range(before, args.steps)
        recomputes = {pid: len(convs.recomputes(pid, after)) for pid in convs.program_ids}
        spread = [
            pid
            for pid in convs.program_ids
            if len({(served[f"{pid}.{t}"].shard, served[f"{pid}.{t}"].worker) for t in after if f"{pid}.{t}" in served}) > 1
        ]
        histogram: dict[int, int] = {}
        for pid in moved:
            histogram[recomputes[pid]] = histogram.get(recomputes[pid], 0) + 1
        first_after = [convs.turns[pid][before] for pid in moved if len(convs.turns[pid]) > before]
        return {
            "shards": count,
            "programs": args.programs,
            "calls": sum(len(t) for t in convs.turns.values()),
            "client_errors": len(problems),
            "first_errors": problems[:5],
            "moved_programs": len(moved),
            "moved_recomputes_histogram": {str(k): v for k, v in sorted(histogram.items())},
            "moved_recomputed_at_first_call_after": sum(bool(convs.recomputes(t.program_id, [before])) for t in first_after),
            "other_recomputes": sum(n for pid, n in recomputes.items() if pid not in moved),
            "spread_after_kill": len(spread),
            "moved_tokens_recomputed_mean": round(statistics.mean(t.prompt_tokens for t in first_after), 1) if first_after else 0,
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
    parser.add_argument("--kill-shard", action="store_true", help="conversations; the first shard killed outright halfway")
    parser.add_argument("--hop", action="store_true", help="one shard: the same load straight to it and through HAProxy")
    parser.add_argument("--store-wait", action="store_true", help="with --db: one gateway without and with --shard")
    parser.add_argument("--passes", type=whole(1, 100), default=3, help="with --hop or --store-wait: turns of each mode")
    args = parser.parse_args()
    if balancer_binary("haproxy") is None:
        raise SystemExit("haproxy is not installed (apt-get install haproxy)")
    if (args.standby or args.store_wait) != bool(args.db):
        parser.error("--standby or --store-wait and --db: give both (they keep their state in PostgreSQL) or neither")
    if sum((args.standby, args.store_wait, args.hop, args.kill_shard)) > 1:
        parser.error("--standby, --store-wait, --hop and --kill-shard: one at a time")
    result: dict[str, Any] = {"cores": os.cpu_count(), "reference_s": reference_s(), "programs": args.programs}
    if args.hop or args.store_wait:
        key = "hop" if args.hop else "store_wait"
        result[key] = run_hop(args) if args.hop else run_store_wait(args)
        result["load_1m"] = round(os.getloadavg()[0], 2)
        for name, row in result[key].items():
            print(
                f"{name}: {row['calls_per_s']} calls/s, p50 {row['latency_ms_p50']} ms, p99 {row['latency_ms_p99']} ms, "
                f"{row['failed']} failed"
                + (f"; adds p50 {row['added_ms_p50']} ms, p99 {row['added_ms_p99']} ms" if "added_ms_p50" in row else ""),
                file=sys.stderr,
            )
        print(json.dumps(result))
        return
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
    if args.kill_shard:
        if args.standby or min(args.shards) < 2 or args.steps < 2:
            parser.error("--kill-shard: shard counts of 2 or more, --steps 2 or more, and no --standby")
        result["kill_shard"] = [run_kill(count, args) for count in args.shards]
        result["load_1m"] = round(os.getloadavg()[0], 2)
        for row in result["kill_shard"]:
            print(
                f"{row['shards']} shards, first killed: {row['moved_programs']} programs moved, programs by their recomputes "
                f"{row['moved_recomputes_histogram']}, {row['other_recomputes']} recomputes "
                f"of the others, {row['spread_after_kill']} spread, {row['client_errors']} client errors",
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
