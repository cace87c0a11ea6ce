"""maitred's Dynamo component against Dynamo's own routers, on the same mocker workers and workload.

One command runs, one after the other, three stacks on 127.0.0.1, each with fresh
``dynamo.mocker`` workers configured alike (KV blocks, block size, speed-up), Dynamo's frontend,
file discovery and the ZMQ event plane (``maitred.harness.dynamo_stack``):

- ``kv``: Dynamo's KV router in the frontend (``--router-mode kv``);
- ``thunderagent``: ``dynamo.thunderagent_router`` (its defaults), the frontend round-robin to it;
- ``maitred``: ``python -m maitred.gateway.dynamo`` (default policy), wired the same way; its
  agents also send their tool calls as ``maitred.tool_call`` events to its ``--http-port``, as
  maitred's clients do (the other two have no use for them).

The workload is the live benchmark's (``maitred.harness.livedemo.drive``, as
``benchmarks/bench_live.py`` runs it): the synthetic Claude-Code-like trace, each program slot
replaying a program (streaming chat, its context growing step by step, the traced tool durations
slept between steps), then the next, for ``--duration`` seconds. Every request names its program
with ``x-dynamo-session-id`` (Dynamo's frontend refuses a body ``program_id``). Routers run in
reverse order on every second of ``--repeats``, so drift in the machine's load hits them alike.

Per router: output tokens/s (completed requests' ``completion_tokens`` over the window), TTFT
mean/p99 as the agents saw it, requests, failed requests and the prompt tokens served from
cache; then the ratios maitred/kv and maitred/thunderagent, and one JSON object with every
figure, the load average and ``reference_s`` (``benchmarks/reference.py``).

Needs an interpreter with Dynamo and maitred (``--python``, default ``$MAITRED_DYNAMO_PYTHON``,
else this one): ``pip install -e '.[dynamo]' && pip install --no-deps ai-dynamo==1.6.1``.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from reference import reference_s

import maitred
from maitred.harness.dynamo_stack import ROUTERS, MockerSpec, start_stack
from maitred.harness.livedemo import RunSummary, Target, drive
from maitred.sim.traces.synthetic import MAX_PROGRAMS, SyntheticSpec, generate

PROGRAMS_PER_SLOT = 4  # a slot whose program ends starts the next: enough for any window


def row(runs: list[RunSummary], window_s: float) -> dict[str, Any]:
    ttft = [t for r in runs for t in r.ttft_s]
    pooled = RunSummary("pooled", ttft_s=ttft)
    pooled.prompt_tokens, pooled.cached_tokens = sum(r.prompt_tokens for r in runs), sum(r.cached_tokens for r in runs)
    return {
        "out_tok_s": round(sum(r.output_tokens for r in runs) / window_s, 1) if window_s else None,
        "ttft_mean_s": round(statistics.fmean(ttft), 3) if ttft else None,
        "ttft_p99_s": round(pooled.ttft(0.99), 3) if ttft else None,
        "requests": sum(r.completed for r in runs),
        "failed": sum(r.errors for r in runs),
        "cache_hit_rate": round(pooled.hit_rate, 3),
    }


def run_one(router: str, args: argparse.Namespace, root: Path, label: str) -> tuple[RunSummary, float]:
    trace = generate(
        SyntheticSpec(programs=min(args.programs * PROGRAMS_PER_SLOT, MAX_PROGRAMS), seed=args.seed, tool_scale=args.tool_scale)
    )
    mocker = MockerSpec(workers=args.workers, gpu_blocks=args.gpu_blocks, block_size=args.block_size, speedup=args.speedup)
    with ExitStack() as stack:
        running = start_stack(router, args.python, root / label, stack, mocker=mocker)
        instrumented = running.admin_url is not None
        if instrumented:
            maitred.configure(runtime_url=running.admin_url)  # the agents' tool events go to the component
        target = Target(running.url, program_id_in_body=False, program_header="x-dynamo-session-id", instrumented=instrumented)
        run = RunSummary(label)
        steps = max(len(p.steps) for p in trace.programs)
        started = time.monotonic()
        drive(target, trace, run, slots=args.programs, steps=steps, time_scale=args.time_scale, deadline=started + args.duration)
        elapsed = time.monotonic() - started
        if instrumented:
            maitred.shutdown(timeout=10)
        running.check()  # a router or worker that died during the window fails the run
        return run, min(elapsed, args.duration)


def ratios(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    mine = table.get("maitred")
    for peer in ("kv", "thunderagent"):
        theirs = table.get(peer)
        if mine is None or theirs is None:
            continue
        out[f"maitred/{peer}"] = {
            key: (round(mine[key] / theirs[key], 3) if mine[key] is not None and theirs[key] else None)
            for key in ("out_tok_s", "ttft_mean_s", "ttft_p99_s")
        }
    return out


def print_table(table: dict[str, dict[str, Any]], ratio: dict[str, dict[str, float | None]]) -> None:
    print(f"{'router':<14}{'out tok/s':>10}{'TTFT mean':>11}{'TTFT p99':>10}{'requests':>10}{'failed':>8}{'cached':>8}")
    for router, r in table.items():
        mean = "-" if r["ttft_mean_s"] is None else f"{r['ttft_mean_s']:.3f}"
        p99 = "-" if r["ttft_p99_s"] is None else f"{r['ttft_p99_s']:.3f}"
        print(
            f"{router:<14}{r['out_tok_s']:>10}{mean:>11}{p99:>10}{r['requests']:>10}{r['failed']:>8}{r['cache_hit_rate']:>8.1%}"
        )
    for name, r in ratio.items():
        print(f"{name}: out tok/s x{r['out_tok_s']}, TTFT mean x{r['ttft_mean_s']}, TTFT p99 x{r['ttft_p99_s']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default=",".join(ROUTERS), help=f"comma-separated, of {', '.join(ROUTERS)} (default: all)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of each router's window (default: 60)")
    p.add_argument("--repeats", type=int, default=1, help="windows per router, alternated (default: 1)")
    p.add_argument("--programs", type=int, default=6, help="program slots (default: 6)")
    p.add_argument("--workers", type=int, default=2, help="mocker workers (default: 2)")
    p.add_argument("--gpu-blocks", type=int, default=1200, help="KV blocks per worker (default: 1200, ~half the contexts)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: 16)")
    p.add_argument("--speedup", type=float, default=10.0, help="the mocker's --speedup-ratio (default: 10)")
    p.add_argument("--time-scale", type=float, default=1.0, help="seconds slept per traced tool second (default: 1)")
    p.add_argument("--tool-scale", type=float, default=1.0, help="the synthetic trace's tool durations x this (default: 1)")
    p.add_argument("--seed", type=int, default=0, help="synthetic trace seed (default: 0)")
    p.add_argument(
        "--python",
        default=os.environ.get("MAITRED_DYNAMO_PYTHON", sys.executable),
        help="interpreter with Dynamo and maitred installed (default: $MAITRED_DYNAMO_PYTHON, else this one)",
    )
    args = p.parse_args(argv)
    routers = [r for r in args.routers.split(",") if r]
    unknown = sorted(set(routers) - set(ROUTERS))
    if unknown or not routers:
        p.error(f"argument --routers: unknown {', '.join(unknown) or '(none given)'}; choose of {', '.join(ROUTERS)}")
    for flag, value in (("--duration", args.duration), ("--speedup", args.speedup), ("--time-scale", args.time_scale)):
        if not value > 0:
            p.error(f"argument {flag}: must be positive, got {value}")
    for flag, value in (("--repeats", args.repeats), ("--programs", args.programs), ("--workers", args.workers)):
        if value < 1:
            p.error(f"argument {flag}: must be at least 1, got {value}")
    if args.gpu_blocks < 1 or args.block_size < 1:
        p.error("argument --gpu-blocks/--block-size: must be at least 1")
    args.routers = routers
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result: dict[str, Any] = {"cores": os.cpu_count(), "loadavg_before": list(os.getloadavg()), "reference_s": reference_s()}
    runs: dict[str, list[RunSummary]] = {r: [] for r in args.routers}
    windows: dict[str, float] = dict.fromkeys(args.routers, 0.0)
    with tempfile.TemporaryDirectory(prefix="bench-dynamo-") as tmp:
        for rep in range(args.repeats):
            for router in args.routers if rep % 2 == 0 else list(reversed(args.routers)):
                print(f"{router} (window {rep + 1}/{args.repeats}) ...", file=sys.stderr, flush=True)
                run, window_s = run_one(router, args, Path(tmp), f"{router}-{rep}")
                runs[router].append(run)
                windows[router] += window_s
    table = {router: row(runs[router], windows[router]) for router in args.routers}
    ratio = ratios(table)
    result.update(
        loadavg_after=list(os.getloadavg()),
        settings={k: v for k, v in vars(args).items() if k != "python"},
        routers=table,
        ratios=ratio,
    )
    print_table(table, ratio)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
