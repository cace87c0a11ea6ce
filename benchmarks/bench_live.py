"""maitred live against sglang-router and ThunderAgent: the same agent programs through each.

One command runs every system as its own process on 127.0.0.1, each in front of its own two
fresh ``maitred sim-worker`` processes, configured alike for all (GPU and HiCache host tokens,
time scale; the write and eviction policies ``maitred sglang-args`` launches SGLang with):

- ``maitred``: ``maitred serve`` with its default policy and ``--priority`` (as ``maitred
  sglang-args`` pairs it with those workers), a fresh SQLite store; the agents send ``program_id``
  in the body and their tool calls as ``maitred.tool_call`` events, as its clients do.
- ``round_robin``, ``cache_aware`` (``--balance-abs-threshold 8``) and ``manual``: sglang-router
  (``pip install sglang-router``; left out, with one line on stderr, when it is not installed).
  ``manual`` routes by the ``x-smg-routing-key`` header, which carries each program's id.
- ``thunderagent``: with ``--thunderagent PATH`` (a checkout of ThunderAgent-org/ThunderAgent, run
  by ``--thunderagent-python``), its ``tr`` scheduler with SGLang metrics, as its README starts
  it; ``program_id`` in the body, ``POST /programs/release`` when a program ends, as its
  examples do. Without the flag it is skipped with one line on stderr.

The workload (``maitred.harness.livedemo.drive``) is the synthetic Claude-Code-like trace: each
of the load's program slots replays a program (streaming chat, its context growing step by step,
the traced tool durations slept between steps), then the next, for ``--duration`` seconds from
the moment the agents start; a request still streaming when the window closes is cut and not
counted. Loads (``--loads``): ``light`` (6 programs), ``oversubscribed`` (32), ``long`` (32,
contexts twice as long), ``idle-heavy`` (32, tool durations ×4) and ``no-host`` (32, no host
KV tier, as ThunderAgent runs). Systems run one after the other per load, in reverse order on
every second of ``--repeats``, so drift in the machine's load hits them alike.

Per system and load: output tokens/s (completed requests' ``completion_tokens`` over the
window), TTFT mean/p95/p99 as the agents saw it, requests, errors, the prompt tokens served from
cache, and the gateway's CPU seconds over the window (the ``maitred serve``, router or
ThunderAgent process and its children, from ``/proc``) and per completed request — maitred's
includes ingesting and storing the agents' events. Then the ratios maitred/ThunderAgent and
maitred/best sglang-router policy, and last one JSON object with every figure and
``reference_s`` (``benchmarks/reference.py``).

``--learned-stats``: before each measured maitred run the workload runs once through a maitred
with the same store (fresh workers, ``--duration`` seconds, other program ids), so the measured
one starts with tool statistics in its store, as a long-running deployment does. That changes
maitred's figures only (the peers keep nothing between runs): its readiness predicts a tool
call's end from the first call instead of after it has seen some, which moves when it warms a
program's KV back before its tool returns and whom it admits — its TTFT and output tokens/s.
``maitred_tool_calls_known_at_start`` in the JSON says how many tool calls its store held when
each measured window opened (0 without the flag). The warming window ends as a measured one
does, so each program's tool call still running at its close is stored as long as it had run.

The defaults finish in about ten minutes on two cores; the comparison in BENCHMARKS.md ran
``--duration 120 --repeats 2``.
"""

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from peers import ROUTING_KEY_HEADER, cpu_seconds, router_installed, spawn, start_router, start_thunderagent
from reference import reference_s

import maitred
from maitred.gateway.sglang.launch import write_policy_for
from maitred.harness.background import free_port, wait_http
from maitred.harness.livedemo import RunSummary, Target, drive
from maitred.sim.traces import Trace
from maitred.sim.traces.synthetic import MAX_PROGRAMS, SyntheticSpec, generate

ROUTER_POLICIES = {"round_robin": (), "cache_aware": ("--balance-abs-threshold", "8"), "manual": ()}
SYSTEMS = ("maitred", *ROUTER_POLICIES, "thunderagent")
PROGRAMS_PER_SLOT = 4  # a slot whose program ends starts the next: enough for any window


@dataclass(frozen=True)
class Load:
    programs: int
    context_scale: float = 1.0
    tool_scale: float = 1.0
    host: bool = True  # workers have a HiCache host tier


LOADS = {
    "light": Load(6),
    "oversubscribed": Load(32),
    "long": Load(32, context_scale=2.0),
    "idle-heavy": Load(32, tool_scale=4.0),
    "no-host": Load(32, host=False),
}


@dataclass
class Figures:
    """One system under one load, summed over its repeats."""

    runs: list[RunSummary] = field(default_factory=list)
    window_s: float = 0.0
    cpu_s: float = 0.0

    def row(self) -> dict[str, Any]:
        runs = self.runs
        pooled = RunSummary("pooled", ttft_s=[t for r in runs for t in r.ttft_s])
        pooled.prompt_tokens, pooled.cached_tokens = sum(r.prompt_tokens for r in runs), sum(r.cached_tokens for r in runs)
        completed = sum(r.completed for r in runs)
        ttft = pooled.ttft_s
        return {
            "out_tok_s": round(sum(r.output_tokens for r in runs) / self.window_s, 1),
            "ttft_mean_s": round(statistics.fmean(ttft), 3) if ttft else None,
            "ttft_p95_s": round(pooled.ttft(0.95), 3) if ttft else None,
            "ttft_p99_s": round(pooled.ttft(0.99), 3) if ttft else None,
            "requests": completed,
            "errors": sum(r.errors for r in runs),
            "cache_hit_rate": round(pooled.hit_rate, 3),
            "gateway_cpu_s": round(self.cpu_s, 2),
            "cpu_ms_per_request": round(self.cpu_s / completed * 1000, 3) if completed else None,
        }


@dataclass(frozen=True)
class Setup:
    gpu_tokens: int
    cpu_tokens: int
    time_scale: float
    duration_s: float
    seed: int
    thunderagent: Path | None
    thunderagent_python: str
    learned_stats: bool
    store_dir: Path
    maitred_args: tuple[str, ...] = ()


def start_workers(stack: ExitStack, setup: Setup, load: Load) -> list[str]:
    """Two fresh simulated workers, launched as ``maitred sglang-args`` launches SGLang."""
    argv = [sys.executable, "-m", "maitred", "sim-worker", "--gpu-tokens", str(setup.gpu_tokens)]
    argv += ["--time-scale", str(setup.time_scale), "--radix-eviction-policy", "priority", "--log-level", "warning"]
    cpu = setup.cpu_tokens if load.host else 0
    if cpu:
        argv += ["--cpu-tokens", str(cpu), "--hicache-write-policy", write_policy_for(cpu / setup.gpu_tokens)]
    ports: list[int] = []
    while len(ports) < 2:  # two free ports, distinct (each is free only until it is bound)
        ports += [p for p in [free_port()] if p not in ports]
    procs = [spawn(stack, [*argv, "--port", str(port)]) for port in ports]  # both start at once
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url, proc in zip(urls, procs):
        wait_http(url + "/health", timeout_s=60, process=proc)
    return urls


def start_maitred(stack: ExitStack, workers: list[str], db: Path, extra: tuple[str, ...] = ()) -> tuple[Target, int]:
    port = free_port()
    argv = [sys.executable, "-m", "maitred", "serve", "--port", str(port), "--priority", "--log-level", "warning", *extra]
    argv += ["--db", f"sqlite:///{db}", *(a for w in workers for a in ("--worker", w))]
    proc = spawn(stack, argv)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", timeout_s=60, process=proc)
    maitred.configure(runtime_url=url)  # the agents' tool events go to this gateway
    return Target(url), proc.pid


def start_system(stack: ExitStack, system: str, workers: list[str], setup: Setup, db: Path) -> tuple[Target, int]:
    """The system in front of ``workers``: the target its agents talk to and the pid whose CPU is counted."""
    if system == "maitred":
        return start_maitred(stack, workers, db, setup.maitred_args)
    if system == "thunderagent":
        assert setup.thunderagent is not None
        url, proc = start_thunderagent(stack, setup.thunderagent, setup.thunderagent_python, workers)
        return Target(url, instrumented=False, release_path="/programs/release"), proc.pid
    url, proc = start_router(stack, workers, system, ROUTER_POLICIES[system])
    header = ROUTING_KEY_HEADER if system == "manual" else None
    return Target(url, program_id_in_body=False, program_header=header, instrumented=False), proc.pid


def workload(load: Load, seed: int) -> Trace:
    slots = load.programs
    spec = SyntheticSpec(
        programs=min(slots * PROGRAMS_PER_SLOT, MAX_PROGRAMS),
        seed=seed,
        tool_scale=load.tool_scale,
        context_scale=load.context_scale,
    )
    return generate(spec)


def window(target: Target, trace: Trace, load: Load, setup: Setup, label: str, pid: int) -> tuple[RunSummary, float, float]:
    """The workload through ``target`` for one window: its summary, seconds and the CPU seconds ``pid`` used."""
    run = RunSummary(label)
    if target.instrumented:  # what maitred's store taught it before the first request (--learned-stats)
        tools = httpx.get(target.url + "/v1/stats/tools", timeout=30).json()["tools"]
        run.metrics["tool_calls_known"] = next(t["n"] for t in tools if t["tool"] == "*" and not t.get("signature"))
    steps = max(len(p.steps) for p in trace.programs)
    cpu0, started = cpu_seconds(pid), time.monotonic()
    drive(
        target,
        trace,
        run,
        slots=load.programs,
        steps=steps,
        time_scale=1.0,
        deadline=started + setup.duration_s,
        pid_prefix=f"{label}-",
    )
    elapsed = time.monotonic() - started
    cpu = cpu_seconds(pid) - cpu0
    if target.instrumented:
        maitred.shutdown(timeout=10)  # its events delivered before the gateway stops
    run.wall_s = elapsed
    return run, min(elapsed, setup.duration_s), cpu


def run_one(system: str, name: str, load: Load, setup: Setup, rep: int) -> tuple[RunSummary, float, float]:
    trace = workload(load, setup.seed)
    db = setup.store_dir / f"{name}-{system}-{rep}.db"
    label = f"{name}-{system}-{rep}"
    if system == "maitred" and setup.learned_stats:
        with ExitStack() as stack:
            target, pid = start_system(stack, system, start_workers(stack, setup, load), setup, db)
            window(target, trace, load, setup, f"warm-{label}", pid)
    with ExitStack() as stack:
        target, pid = start_system(stack, system, start_workers(stack, setup, load), setup, db)
        return window(target, trace, load, setup, label, pid)


def ratios(table: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per load: maitred's output tokens/s and TTFT mean over ThunderAgent's and the best router's."""
    out: dict[str, dict[str, Any]] = {}
    for name, systems in table.items():
        ours = systems.get("maitred")
        if ours is None:
            continue
        entry: dict[str, Any] = {}
        routers = {s: systems[s] for s in ROUTER_POLICIES if s in systems}
        peers = {"thunderagent": systems.get("thunderagent")}
        if routers:
            best = max(routers, key=lambda s: routers[s]["out_tok_s"])
            entry["best_router"] = best
            peers["best_router"] = routers[best]
        for peer, row in peers.items():
            if row is None:
                continue
            if row["out_tok_s"]:
                entry[f"out_tok_s_vs_{peer}"] = round(ours["out_tok_s"] / row["out_tok_s"], 3)
            if row["ttft_mean_s"] and ours["ttft_mean_s"] is not None:
                entry[f"ttft_mean_vs_{peer}"] = round(ours["ttft_mean_s"] / row["ttft_mean_s"], 3)
        out[name] = entry
    return out


def print_table(table: dict[str, dict[str, dict[str, Any]]], ratio: dict[str, dict[str, Any]], title: str) -> None:
    from rich.table import Table

    from maitred.console import output_console

    console = output_console()
    console.width = max(console.width, 130)
    t = Table(title=title)
    columns = {
        "out_tok_s": "out tok/s",
        "ttft_mean_s": "TTFT mean s",
        "ttft_p95_s": "p95 s",
        "ttft_p99_s": "p99 s",
        "requests": "requests",
        "errors": "errors",
        "cache_hit_rate": "cache hits",
        "gateway_cpu_s": "gateway CPU s",
        "cpu_ms_per_request": "CPU ms/req",
    }
    t.add_column("load")
    t.add_column("system")
    for label in columns.values():
        t.add_column(label, justify="right")
    for name, systems in table.items():
        for system, row in systems.items():
            t.add_row(name, system, *("—" if row[c] is None else f"{row[c]:,}" for c in columns))
        t.add_section()
    console.print(t)
    for name, entry in ratio.items():
        parts = []
        for peer, label in (("thunderagent", "ThunderAgent"), ("best_router", f"best router ({entry.get('best_router')})")):
            if f"out_tok_s_vs_{peer}" in entry:
                ttft = entry.get(f"ttft_mean_vs_{peer}")
                parts.append(f"maitred/{label}: out tok/s {entry[f'out_tok_s_vs_{peer}']}×, TTFT mean {ttft}×")
        console.print(f"{name}: " + ("; ".join(parts) or "no peer ran"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default=",".join(LOADS), help=f"comma-separated, of {', '.join(LOADS)} (default: all)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)} (default: all)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of each system's window (default: 15)")
    parser.add_argument("--repeats", type=int, default=1, help="windows per system and load, alternated (default: 1)")
    parser.add_argument("--programs", type=int, help="program slots of every load (default: each load's own)")
    parser.add_argument("--gpu-tokens", type=int, default=160_000, help="GPU KV tokens per worker (default: 160,000)")
    parser.add_argument(
        "--cpu-tokens", type=int, default=320_000, help="host KV tokens per worker, but no-host's 0 (default: 320,000)"
    )
    parser.add_argument(
        "--time-scale", type=float, default=4.0, help="the workers run this much faster than the profiled GPU (default: 4)"
    )
    parser.add_argument("--seed", type=int, default=0, help="synthetic trace seed (default: 0)")
    parser.add_argument("--thunderagent", type=Path, help="a ThunderAgent checkout to run (default: ThunderAgent is skipped)")
    parser.add_argument(
        "--thunderagent-python", default=sys.executable, help="interpreter with ThunderAgent's dependencies (default: this one)"
    )
    parser.add_argument(
        "--learned-stats", action="store_true", help="maitred starts with tool statistics in its store (see above)"
    )
    parser.add_argument(
        "--maitred-args",
        default="",
        help='more flags for maitred serve, one shell-quoted string after = (e.g. --maitred-args="--tick 0.5"; default: none)',
    )
    args = parser.parse_args(argv)
    for flag, values, known in (("--loads", args.loads, LOADS), ("--systems", args.systems, SYSTEMS)):
        unknown = [v for v in values.split(",") if v not in known]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.duration <= 0 or args.repeats < 1:
        parser.error("--duration must be positive and --repeats at least 1")
    if args.programs is not None and not 1 <= args.programs <= MAX_PROGRAMS // PROGRAMS_PER_SLOT:
        parser.error(f"--programs: 1 to {MAX_PROGRAMS // PROGRAMS_PER_SLOT}, got {args.programs}")
    if args.gpu_tokens < 1 or args.cpu_tokens < 0:
        parser.error("--gpu-tokens must be positive and --cpu-tokens 0 or more")
    try:
        shlex.split(args.maitred_args)
    except ValueError as exc:
        parser.error(f"--maitred-args: {exc}")
    return args


def chosen_systems(args: argparse.Namespace) -> list[str]:
    """The systems asked for that can run here (each one left out says why on stderr)."""
    systems = args.systems.split(",")
    if any(s in ROUTER_POLICIES for s in systems) and not router_installed():
        systems = [s for s in systems if s not in ROUTER_POLICIES]
    if "thunderagent" in systems and args.thunderagent is None:
        print("thunderagent: skipped (pass --thunderagent PATH, a checkout of ThunderAgent-org/ThunderAgent)", file=sys.stderr)
        systems.remove("thunderagent")
    return systems


def main(argv: list[str] | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    systems = chosen_systems(args)
    loads = {name: LOADS[name] for name in args.loads.split(",")}
    if args.programs is not None:
        loads = {name: replace(load, programs=args.programs) for name, load in loads.items()}
    result: dict[str, Any] = {"cores": os.cpu_count(), "loadavg_before": list(os.getloadavg()), "reference_s": reference_s()}
    figures = {name: {s: Figures() for s in systems} for name in loads}
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        setup = Setup(
            args.gpu_tokens,
            args.cpu_tokens,
            args.time_scale,
            args.duration,
            args.seed,
            args.thunderagent,
            args.thunderagent_python,
            args.learned_stats,
            Path(tmp),
            tuple(shlex.split(args.maitred_args)),
        )
        for rep in range(args.repeats):
            for name, load in loads.items():
                for system in systems if rep % 2 == 0 else systems[::-1]:
                    run, seconds, cpu = run_one(system, name, load, setup, rep)
                    f = figures[name][system]
                    f.runs.append(run)
                    f.window_s += seconds
                    f.cpu_s += cpu
                    say(
                        f"{name} {system} #{rep}: {run.output_tokens / seconds:,.0f} out tok/s, "
                        f"{run.completed} requests, {run.errors} errors, gateway CPU {cpu:.2f} s"
                    )
    table = {name: {s: f.row() for s, f in per.items()} for name, per in figures.items()}
    ratio = ratios(table)
    result |= {
        "loadavg_after": list(os.getloadavg()),
        "config": {
            "duration_s": args.duration,
            "repeats": args.repeats,
            "gpu_tokens": args.gpu_tokens,
            "cpu_tokens": args.cpu_tokens,
            "time_scale": args.time_scale,
            "seed": args.seed,
            "learned_stats": args.learned_stats,
            "maitred_args": args.maitred_args,
            "programs": {name: load.programs for name, load in loads.items()},
        },
        "loads": table,
        "maitred_tool_calls_known_at_start": {
            name: [int(r.metrics["tool_calls_known"]) for r in per["maitred"].runs]
            for name, per in figures.items()
            if "maitred" in per
        },
        "ratios": ratio,
    }
    title = f"the same agent programs through each gateway ({args.duration:g} s windows × {args.repeats})"
    print_table(table, ratio, title)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
