"""The live demo: instrumented agent programs through the gateway to two simulated workers.

Two simulated SGLang workers (the documented stand-in for GPUs) and ``maitred serve`` run on
127.0.0.1. A few dozen programs from the synthetic Claude-Code-like trace run at once, each in
its own thread the way an agent would: ``maitred.program`` around the session, a streaming chat
request per model step (its context growing step by step, its program id in the body), and the
step's tool calls as ``maitred.tool_call`` blocks that sleep for the traced durations (times
``time_scale``). The middleware sends the tool events to the gateway, which stores them.

The same workload runs once under ``maitred`` and once under ``round_robin``, against the same
workers: HiCache host memory (twice the GPU's by default) with the write policy ``maitred
sglang-args`` launches SGLang with for that pool (write-back below twice the GPU, write-through
from there on). GPU memory is sized so that only about half of the programs' contexts fit at
once, which is where the policy matters. What is measured is what a client sees: time to first
token and the prompt tokens the workers served from cache.
"""

import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

import maitred
from maitred.gateway.app import ServeConfig, build_app
from maitred.gateway.loop import LiveConfig, LiveDriver
from maitred.gateway.sglang.launch import write_policy_for
from maitred.harness.background import BackgroundServer
from maitred.middleware.emitter import EmitterSettings
from maitred.runtime.admission import HOLD_TIMEOUT_S
from maitred.sim.traces import ProgramTrace, Trace
from maitred.sim.traces.synthetic import SyntheticSpec, generate
from maitred.sim.worker.app import create_app
from maitred.sim.worker.config import SimWorkerConfig

#: One thread per program against two workers: beyond this the demo measures the threads.
MAX_PROGRAMS = 200

#: What each tier the gateway reports means, in the PNG's legend and the printed summary.
TIER_LABELS = {
    "gpu": "KV on a GPU",
    "cpu": "KV in host memory (demoted)",
    "waiting": "KV dropped or not yet built (a full prefill when admitted)",
}


@dataclass(frozen=True)
class LiveDemoConfig:
    programs: int = 32
    seed: int = 0
    steps: int = 8  # the first steps of each traced program
    # demo seconds per traced tool second: 0.4 keeps a first ``make demo`` (install included)
    # under two minutes; the engine is sped up by as much, so tools and model steps keep the
    # trace's proportions
    time_scale: float = 0.4
    engine_speedup: float = 25.0  # the simulated GPUs run this much faster than the profiled one
    gpu_tokens: int = 120_000  # per worker: about half of the programs' contexts fit in the two
    cpu_tokens: int = 240_000  # per worker: HiCache host memory, twice the GPU pool
    hold_timeout_s: float = HOLD_TIMEOUT_S  # the gateway default
    policies: tuple[str, ...] = ("maitred", "round_robin")

    def __post_init__(self) -> None:
        if not 1 <= self.programs <= MAX_PROGRAMS:
            raise ValueError(f"programs: 1 to {MAX_PROGRAMS}, got {self.programs}")
        if self.steps < 1 or self.time_scale <= 0 or self.engine_speedup <= 0:
            raise ValueError("steps must be at least 1; time_scale and engine_speedup positive")
        if self.gpu_tokens < 1 or self.cpu_tokens < 0:
            raise ValueError(f"gpu_tokens must be positive and cpu_tokens 0 or more, got {self.gpu_tokens}, {self.cpu_tokens}")


@dataclass
class RunSummary:
    policy: str
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0  # of the requests that completed (before the deadline, with one)
    completed: int = 0  # model requests answered in full
    errors: int = 0
    tiers: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # (seconds since start, programs per tier)
    metrics: dict[str, float] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft(self, q: float) -> float:
        ordered = sorted(self.ttft_s)
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


@dataclass(frozen=True)
class Target:
    """Where the agents send their model requests and how each names its program there, so the
    same workload can run through maitred and through the gateways it is compared with.

    maitred (and ThunderAgent) read ``program_id`` in the body; sglang-router's manual policy
    reads a routing-key header; its other policies read nothing. ``instrumented`` wraps each
    program and tool call in ``maitred.program``/``maitred.tool_call`` (events to wherever
    ``maitred.configure`` sent them); a peer has no use for them. ``release_path``: a route the
    agent POSTs ``{"program_id": ...}`` to when its program ends (ThunderAgent's clients free its
    bookkeeping that way; maitred learns it from the ``program.end`` event)."""

    url: str
    program_id_in_body: bool = True
    program_header: str | None = None
    instrumented: bool = True
    release_path: str | None = None


def _words(seed: int, n: int) -> str:
    """``n`` words of four characters, one token each for the simulated worker, and about what
    a real tokenizer makes of English (so the gateway's estimate before the first answer is sane)."""
    letter = "abcdefghijklmnopqrstuvwxyz"[seed % 26]
    return " ".join(f"{letter}{(seed * 7919 + i * 31) % 1000:03d}" for i in range(max(n, 0)))


class _Agent:
    """One traced program replayed against a target, as an instrumented agent would run, until
    its steps are done or the ``deadline`` (``time.monotonic()``) passes: then it stops at once,
    a stream in flight closed and not counted, a tool sleep cut short."""

    def __init__(
        self,
        index: int,
        pid: str,
        trace: ProgramTrace,
        prefix: dict[str, int],
        target: Target,
        steps: int,
        time_scale: float,
        run: RunSummary,
        lock: threading.Lock,
        deadline: float | None = None,
    ) -> None:
        self.index, self.pid, self.trace, self.prefix, self.target = index, pid, trace, prefix, target
        self.steps, self.time_scale, self.run, self.lock, self.deadline = steps, time_scale, run, lock, deadline

    def _left_s(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def __call__(self) -> None:
        steps = self.trace.steps[: self.steps]
        agent = steps[0].agent
        messages: list[dict[str, Any]] = [{"role": "system", "content": _words(len(agent), self.prefix.get(agent, 0))}]
        size = self.prefix.get(agent, 0)
        instrumented = self.target.instrumented
        headers = {self.target.program_header: self.pid} if self.target.program_header else {}
        with (
            httpx.Client(base_url=self.target.url, timeout=300, headers=headers) as client,
            maitred.program(self.pid, agent=agent, framework="demo") if instrumented else nullcontext(),
        ):
            for k, step in enumerate(steps):
                messages.append({"role": "user", "content": _words(self.index * 100 + k, step.input_tokens - size)})
                reply = self._model_step(client, messages, step.output_tokens)
                if reply is None:
                    return
                size = step.input_tokens + step.output_tokens
                messages.append({"role": "assistant", "content": reply})
                for tool in step.tools:
                    with (
                        maitred.tool_call(tool.name, timeout=tool.deadline_s, signature=tool.signature)
                        if instrumented
                        else nullcontext()
                    ):
                        wait_s = tool.duration_s * self.time_scale
                        time.sleep(max(min(wait_s, self._left_s()), 0.0))
                    if self._left_s() <= 0:
                        return
            if self.target.release_path:
                try:
                    client.post(self.target.release_path, json={"program_id": self.pid}).raise_for_status()
                except httpx.HTTPError:
                    with self.lock:
                        self.run.errors += 1

    def _model_step(self, client: httpx.Client, messages: list[dict[str, Any]], output_tokens: int) -> str | None:
        """The reply's text ("" after an error, counted), or None when the deadline came first."""
        if self._left_s() <= 0:
            return None
        body = {
            "model": "sim",
            "messages": messages,
            "max_tokens": max(output_tokens, 1),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.target.program_id_in_body:
            body["program_id"] = self.pid
        started, first, text = time.perf_counter(), None, []
        usage: dict[str, Any] = {}
        # a request held by the gateway sends nothing: waiting for a line must end at the deadline too
        timeout = httpx.Timeout(300.0, read=min(300.0, max(self._left_s(), 0.01)))
        try:
            with client.stream("POST", "/v1/chat/completions", json=body, timeout=timeout) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if self._left_s() <= 0:
                        return None
                    if not line.startswith("data: {"):
                        continue
                    chunk = orjson.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        if first is None:
                            first = time.perf_counter() - started
                        text.append(choice.get("delta", {}).get("content") or "")
                    usage = chunk.get("usage") or usage
        except httpx.HTTPError:
            if self._left_s() <= 0:
                return None
            with self.lock:
                self.run.errors += 1
            return ""
        with self.lock:
            if first is not None:
                self.run.ttft_s.append(first)
            self.run.completed += 1
            self.run.prompt_tokens += usage.get("prompt_tokens", 0)
            self.run.output_tokens += usage.get("completion_tokens", 0)
            self.run.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return "".join(text)


def drive(
    target: Target,
    trace: Trace,
    run: RunSummary,
    *,
    slots: int,
    steps: int,
    time_scale: float,
    deadline: float | None = None,
    pid_prefix: str = "",
) -> None:
    """Run the trace's programs through ``target``, ``slots`` at a time, each slot in its own
    thread: slot ``i`` runs programs ``i``, ``i + slots``, ... one after the other (a new
    program as soon as one ends, as a fleet of agents would), until they are done or the
    ``deadline`` passes. Program ids are ``pid_prefix`` and the program's index."""
    lock = threading.Lock()

    def slot(i: int) -> None:
        for index in range(i, len(trace.programs), slots):
            if deadline is not None and time.monotonic() >= deadline:
                return
            program = trace.programs[index]
            _Agent(index, f"{pid_prefix}{index}", program, trace.prefix_tokens, target, steps, time_scale, run, lock, deadline)()

    threads = [threading.Thread(target=slot, args=(i,), name=f"agent-{i}") for i in range(min(slots, len(trace.programs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _sample_tiers(url: str, run: RunSummary, started: float, stop: threading.Event) -> None:
    """Programs per tier every half second, the first at once and the last as the run ends, so
    even a run shorter than the period has its start and end on the plot."""
    with httpx.Client(base_url=url, timeout=10) as client:
        ended = False
        while True:
            try:
                tiers = Counter(p["tier"] for p in client.get("/v1/programs").json())
                run.tiers.append((time.monotonic() - started, {t: tiers.get(t, 0) for t in TIER_LABELS}))
            except httpx.HTTPError:
                pass  # one missed sample; the next comes half a second later
            if ended:
                return
            ended = stop.wait(0.5)


def _metric(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _workers_seen(runtime: LiveDriver) -> str:
    """The workers as the gateway read them from ``/server_info`` (the demo's are alike)."""
    workers = list(runtime.state.workers.values())
    w = workers[0]
    hicache = f"HiCache {'write_back' if w.write_back else 'write_through'}" if w.cpu_tokens else "no host cache"
    return f"{len(workers)} simulated workers ({w.gpu_tokens:,} GPU and {w.cpu_tokens:,} host tokens each, {hicache})"


def run_policy(policy: str, cfg: LiveDemoConfig, db_url: str | None, progress: Callable[[str], None] = print) -> RunSummary:
    trace = generate(SyntheticSpec(programs=cfg.programs, seed=cfg.seed, min_steps=cfg.steps, max_steps=cfg.steps + 20))
    run = RunSummary(policy)
    sim = SimWorkerConfig(
        gpu_tokens=cfg.gpu_tokens,
        cpu_tokens=cfg.cpu_tokens,
        time_scale=cfg.engine_speedup,
        radix_eviction_policy="priority",
        hicache_write_policy=write_policy_for(cfg.cpu_tokens / cfg.gpu_tokens),
    )
    with BackgroundServer(create_app(sim)) as w0, BackgroundServer(create_app(sim)) as w1:
        runtime = LiveConfig(policy=policy, hold_timeout_s=cfg.hold_timeout_s, priority=True)
        gateway = build_app(ServeConfig([w0.url, w1.url], db_url=db_url, runtime=runtime, wait_for_workers_s=30))
        with BackgroundServer(gateway.app) as server:
            maitred.configure(runtime_url=server.url, settings=EmitterSettings(interval_s=0.05))
            stop = threading.Event()
            started = time.monotonic()
            sampler = threading.Thread(target=_sample_tiers, args=(server.url, run, started, stop), daemon=True)
            sampler.start()
            progress(f"{policy}: {len(trace.programs)} programs through the gateway to {_workers_seen(gateway.runtime)} ...")
            drive(
                Target(server.url),
                trace,
                run,
                slots=len(trace.programs),
                steps=cfg.steps,
                time_scale=cfg.time_scale,
                pid_prefix=f"{policy}-",
            )
            run.wall_s = time.monotonic() - started
            stop.set()
            sampler.join()
            maitred.flush(timeout=10)
            with httpx.Client(base_url=server.url, timeout=30) as client:
                text = client.get("/metrics").text
                run.tools = client.get("/v1/stats/tools").json()["tools"]
            for name in (
                "maitred_held_requests_total",
                "maitred_forced_admissions_total",
                "maitred_tier_moves_total",
                "maitred_warmups_total",
                "maitred_queue_wait_seconds_sum",
                "maitred_queue_wait_seconds_count",
            ):
                run.metrics[name] = _metric(text, name)
    return run


def run_live_demo(
    cfg: LiveDemoConfig, db_url: str | None, png: Path | None, progress: Callable[[str], None] = print
) -> list[RunSummary]:
    runs = [run_policy(policy, cfg, db_url, progress) for policy in cfg.policies]
    if png is not None:
        write_png(runs, png)
    return runs


def summary_rows(runs: list[RunSummary]) -> list[dict[str, Any]]:
    return [
        {
            "policy": r.policy,
            "requests": len(r.ttft_s),
            "errors": r.errors,
            "wall_s": round(r.wall_s, 1),
            "ttft_mean_s": round(statistics.fmean(r.ttft_s), 3) if r.ttft_s else None,
            "ttft_p95_s": round(r.ttft(0.95), 3),
            "cache_hit_rate": round(r.hit_rate, 3),
            "held_requests": int(r.metrics.get("maitred_held_requests_total", 0)),
            "forced_admissions": int(r.metrics.get("maitred_forced_admissions_total", 0)),
            "tier_moves": int(r.metrics.get("maitred_tier_moves_total", 0)),
            "warmups": int(r.metrics.get("maitred_warmups_total", 0)),
        }
        for r in runs
    ]


def write_png(runs: list[RunSummary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    tiered = next((r for r in runs if r.policy == "maitred"), runs[0])
    if tiered.tiers:
        t = [x for x, _ in tiered.tiers]
        # a tier no program was ever in is left out, not drawn as an empty band in the legend
        shown = [tier for tier in TIER_LABELS if any(c[tier] for _, c in tiered.tiers)]
        stacks = [[c[tier] for _, c in tiered.tiers] for tier in shown]
        axes[0].stackplot(t, stacks, labels=[TIER_LABELS[tier] for tier in shown], alpha=0.85)
        axes[0].legend(loc="upper right", fontsize=8)
    axes[0].set(title=f"{tiered.policy}: programs per tier", xlabel="seconds", ylabel="programs")
    for r in runs:
        ordered = sorted(r.ttft_s)
        if ordered:
            axes[1].plot(
                ordered,
                [(i + 1) / len(ordered) for i in range(len(ordered))],
                label=f"{r.policy} (mean {statistics.fmean(ordered):.2f} s, cache hits {r.hit_rate:.0%})",
            )
    axes[1].set(title="time to first token", xlabel="seconds", ylabel="share of requests", xscale="log")
    axes[1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_summary(runs: list[RunSummary], png: Path | None) -> None:
    from rich.table import Table

    from maitred.console import output_console

    console = output_console()
    console.width = max(console.width, 110)  # the summary has eleven columns
    rows = summary_rows(runs)
    labels = {
        "ttft_mean_s": "TTFT mean s",
        "ttft_p95_s": "TTFT p95 s",
        "cache_hit_rate": "cache hits",
        "held_requests": "held",
        "forced_admissions": "forced",
    }
    legend = (
        "held: requests the policy kept waiting for GPU room before sending them (round robin never holds); "
        "forced: held requests sent anyway at the hold bound; tier moves: programs demoted to host memory "
        "or brought back; warmups: prefills sent ahead of a program's return"
    )
    table = Table(
        title="the same programs, two policies (time to first token as the agents saw it)", caption=legend, caption_justify="left"
    )
    for column in rows[0]:
        table.add_column(labels.get(column, column.replace("_", " ")), justify="left" if column == "policy" else "right")
    for row in rows:
        table.add_row(*("—" if v is None else str(v) for v in row.values()))
    console.print(table)
    tiers = next((r for r in runs if r.policy == "maitred"), runs[0]).tiers
    if tiers:
        peak = max(tiers, key=lambda tc: tc[1]["cpu"] + tc[1]["waiting"])
        console.print(
            f"programs per tier under maitred, at the most crowded moment ({peak[0]:.0f} s): "
            + "; ".join(f"{TIER_LABELS[k]}: {v}" for k, v in peak[1].items())
        )
    tools = [t for t in runs[0].tools if not t.get("signature") and t["tool"] != "*"]
    if tools:
        table = Table(title="tool durations the gateway learned (GET /v1/stats/tools)")
        for column in ("tool", "n", "mean s", "min s", "max s"):
            table.add_column(column, justify="left" if column == "tool" else "right")
        for t in sorted(tools, key=lambda t: -t["n"]):
            table.add_row(t["tool"], str(t["n"]), f"{t['mean_s']:.2f}", f"{t['min_s']:.2f}", f"{t['max_s']:.2f}")
        console.print(table)
    if png is not None:
        console.print(f"wrote {png}")
