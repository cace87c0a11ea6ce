"""Cost of one ``maitred`` scheduler step at 100, 1,000 and 10,000 programs on 8 workers.

Programs are in a realistic mix (60% acting in a tool with history, 25% reasoning, 5% waiting on
a human, 10% just returned), spread over 8 workers whose GPU tier is ~10% oversubscribed and
with new arrivals every step, so tiering, placement and pre-prefill all have work. Each size is
stepped repeatedly with the state advancing between steps; the figure is the median step time.

A step is the one the gateway runs (``maitred.gateway.loop``): ``snapshot()`` on the event
loop, then ``view`` (every program's signals), ``plan`` and ``free_after`` in its thread, then
``apply`` (the re-check against the live state) back on the loop. The median of each part is
reported beside the whole. ``reference_s`` times a fixed pure-Python workload in the same run,
so that figures from machines of different speed (or a loaded one) can be compared.
Also: DP against BFD on the same placement instances, and how often the DP fell back to BFD.

    python benchmarks/bench_scheduler.py [--steps 30]
"""

import argparse
import json
import random
import statistics
import time

from maitred.events import LLMEnd, LLMStart, ProgramStart, ProgramWait, ToolEnd, ToolStart
from maitred.runtime import RuntimeState, Scheduler, SignalConfig, WorkerState
from maitred.runtime.placement import Item, solve_bfd, solve_dp
from maitred.runtime.scheduler import free_after

WORKERS = 8
T0 = 1_000_000.0
PARTS = ("snapshot", "view", "plan", "free_after", "apply")


def build(n: int, rng: random.Random) -> RuntimeState:
    mean_tokens = 12_000
    gpu = int(n * (mean_tokens + 512) / WORKERS / 1.1 * 0.6)
    st = RuntimeState([WorkerState(f"w{i}", gpu_tokens=gpu, cpu_tokens=gpu) for i in range(WORKERS)])
    for tool, mean in (("read", 0.2), ("grep", 0.1), ("pytest", 20.0), ("edit", 0.05)):
        for _ in range(50):
            st.history.record(tool, None, rng.expovariate(1 / mean))
    for i in range(n):
        pid = f"p{i}"
        t = T0 - rng.uniform(0, 600)
        tokens = int(rng.lognormvariate(9.2, 0.6))
        st.apply(ProgramStart(ts=t, program_id=pid, agent=rng.choice(["planner", "coder"])))
        for step in range(rng.randint(1, 6)):
            st.apply(LLMStart(ts=t, program_id=pid, request_id=f"r{step}", prompt_tokens=tokens))
            t += rng.uniform(1, 4)
            st.apply(
                LLMEnd(
                    ts=t,
                    program_id=pid,
                    request_id=f"r{step}",
                    prompt_tokens=tokens,
                    completion_tokens=80,
                    worker=f"w{i % WORKERS}",
                )
            )
            st.apply(ToolStart(ts=t, program_id=pid, call_id=f"c{step}", tool=rng.choice(["read", "grep", "pytest", "edit"])))
            t += rng.expovariate(0.5)
            st.apply(ToolEnd(ts=t, program_id=pid, call_id=f"c{step}"))
        kind = rng.random()
        if kind < 0.6:
            st.apply(ToolStart(ts=T0 - rng.uniform(0, 5), program_id=pid, call_id="open", tool=rng.choice(["read", "pytest"])))
        elif kind < 0.85:
            st.apply(LLMStart(ts=T0 - rng.uniform(0, 2), program_id=pid, request_id="now", prompt_tokens=tokens))
        elif kind < 0.9:
            st.apply(ProgramWait(ts=T0 - 1, program_id=pid))
    return st


def churn(st: RuntimeState, rng: random.Random, now: float, step: int) -> None:
    """Between steps: some tools end, some programs start a model call, a few new programs arrive."""
    ids = list(st.programs)
    for pid in rng.sample(ids, max(1, len(ids) // 50)):
        p = st.programs[pid]
        if p.tool is not None and not p.returned:
            st.apply(ToolEnd(ts=now, program_id=pid, call_id=p.tool.call_id))
        else:
            st.apply(LLMStart(ts=now, program_id=pid, request_id=f"s{step}", prompt_tokens=p.context_tokens + 300))
    for j in range(3):
        pid = f"new-{step}-{j}"
        st.apply(
            LLMStart(ts=now, program_id=pid, agent="coder", request_id="r0", prompt_tokens=int(rng.lognormvariate(8.5, 0.5)))
        )


def gateway_step(st: RuntimeState, sched: Scheduler, now: float) -> dict[str, float]:
    """One step as the gateway runs it; milliseconds spent in each part."""
    marks = [time.perf_counter()]
    snapshot = st.snapshot()
    marks.append(time.perf_counter())
    view = snapshot.view(now)
    marks.append(time.perf_counter())
    decision = sched.plan(view)
    marks.append(time.perf_counter())
    free = free_after(decision, view)
    marks.append(time.perf_counter())
    sched.apply(decision, view, free)
    marks.append(time.perf_counter())
    return {part: (marks[i + 1] - marks[i]) * 1000 for i, part in enumerate(PARTS)}


def measure(n: int, steps: int, seed: int) -> tuple[float, dict[str, float], int, int]:
    """Median step time and median of each part (ms), steps with placement, BFD fallbacks."""
    rng = random.Random(seed)
    st = build(n, rng)
    sched = Scheduler(st, "maitred")
    gateway_step(st, sched, T0 - 1)  # the initial placement of every program: a cold start, not a step
    sched.dp_steps = sched.dp_fallbacks = 0
    totals: list[float] = []
    parts: dict[str, list[float]] = {part: [] for part in PARTS}
    now = T0
    for step in range(steps):
        churn(st, rng, now, step)
        spent = gateway_step(st, sched, now)
        totals.append(sum(spent.values()))
        for part, ms in spent.items():
            parts[part].append(ms)
        now += 1.0
    return (
        statistics.median(totals),
        {part: round(statistics.median(ms), 2) for part, ms in parts.items()},
        sched.dp_steps,
        sched.dp_fallbacks,
    )


def reference(rounds: int = 5) -> float:
    """Seconds a fixed pure-Python workload (sorting, dict building, a generator sum) takes on
    this machine now, the fastest of ``rounds``: a slower or loaded machine shows in it."""
    rng = random.Random(0)
    values = [rng.random() for _ in range(200_000)]
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        table = {i: x for i, x in enumerate(sorted(values))}
        sum(x for x in table.values() if x > 0.5)
        best = min(best, time.perf_counter() - began)
    return best


def dp_vs_bfd(rng: random.Random, instances: int = 200) -> tuple[float, float, float]:
    cfg = SignalConfig()
    dp_ms, bfd_ms, better = [], [], 0
    for _ in range(instances):
        caps = [rng.randint(10_000, 80_000) for _ in range(WORKERS)]
        items = [
            Item(
                f"i{j}",
                rng.randint(1_000, 30_000),
                tuple((rng.choice([0, 0, rng.randint(0, 20_000)]), rng.randint(0, 1), rng.randint(500, 30_000)) for _ in caps),
            )
            for j in range(rng.randint(2, 6))
        ]
        began = time.perf_counter()
        plan = solve_dp(items, caps, quanta=cfg.dp_quanta, state_budget=cfg.dp_state_budget)
        dp_ms.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        solve_bfd(items, caps)
        bfd_ms.append((time.perf_counter() - began) * 1000)
        better += plan is not None
    return statistics.median(dp_ms), statistics.median(bfd_ms), better / instances


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ref_s = reference()
    p50: dict[str, float] = {}
    parts_p50: dict[str, dict[str, float]] = {}
    dp_steps = fallbacks = 0
    for n in (100, 1_000, 10_000):
        ms, parts, steps, fb = measure(n, args.steps if n < 10_000 else max(5, args.steps // 3), args.seed)
        p50[f"{n}x{WORKERS}"] = round(ms, 2)
        parts_p50[f"{n}x{WORKERS}"] = parts
        dp_steps += steps
        fallbacks += fb
        print(
            f"{n:>6} programs x {WORKERS} workers: step p50 {ms:.2f} ms "
            f"({', '.join(f'{part} {v:.2f}' for part, v in parts.items())}; "
            f"{steps} steps with placement, {fb} fell back to BFD)"
        )
    dp_ms, bfd_ms, dp_share = dp_vs_bfd(random.Random(args.seed))
    print(
        f"placement of 2-6 candidates on {WORKERS} workers: DP p50 {dp_ms:.2f} ms, BFD p50 {bfd_ms:.3f} ms, "
        f"DP within budget {dp_share:.0%}"
    )
    ref_s = min(ref_s, reference())  # before and after the steps: load that came and went shows less
    print(
        json.dumps(
            {
                "step_ms_p50": p50,
                "bfd_fallback_share": round(fallbacks / max(dp_steps, 1), 3),
                "dp_ms_p50": round(dp_ms, 3),
                "bfd_ms_p50": round(bfd_ms, 3),
                "parts_ms_p50": parts_p50,
                "reference_s": round(ref_s, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
