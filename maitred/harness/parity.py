"""Parity: one short trace through the replay and through a live gateway, decision by decision.

Both drivers run ``RuntimeCore``; this harness is what keeps them from drifting apart. The live
side starts simulated SGLang workers (the engine model in real time, ``time_scale`` 1) and a
gateway with its journal on, all on 127.0.0.1, and plays each program of the trace in its own
thread, started ``start_gap_s`` apart like the replay's slots (``RunConfig(once=True)``):
``program.start``, then per step a streaming ``/generate`` of exactly the step's prompt tokens
(token ids, so the gateway's estimate is the replay's count) and output length, then the step's
tool calls as ``tool.start`` / ``tool.end`` events around a sleep of the traced duration, and
``program.end``. The journals are compared without their times; workers are named by their
sorted order (``w0``, ``w1``, ... in both).
"""

import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from maitred.identity import PROGRAM_HEADER
from maitred.sim.replay import Replay, RunConfig
from maitred.sim.traces import ProgramTrace, Trace

#: journal kinds compared (``force`` and ``lazy`` depend on timing to the millisecond)
COMPARED = ("admit", "assign", "move")


@dataclass(frozen=True, slots=True)
class ParityRun:
    journal: list[tuple[str, str, str, str]]  # (kind, program, worker, detail), in order
    throughput_tok_s: float  # output tokens over the makespan
    ttft_mean_s: float
    requests: int
    ttft_s: dict[str, list[float]]  # per program, in step order


@dataclass(frozen=True, slots=True)
class ParitySetup:
    policy: str
    workers: int = 2
    gpu_tokens: int = 100_000
    cpu_ratio: float = 1.0
    start_gap_s: float = 0.5

    def run_config(self, trace: Trace) -> RunConfig:
        return RunConfig(
            self.policy,
            len(trace.programs),
            self.cpu_ratio,
            duration_s=3600.0,
            workers=self.workers,
            gpu_tokens=self.gpu_tokens,
            once=True,
            start_gap_s=self.start_gap_s,
            journal=True,
        )


def _compared(entries: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    return [e for e in entries if e[0] in COMPARED]


def replay_side(trace: Trace, setup: ParitySetup) -> ParityRun:
    replay = Replay(trace, setup.run_config(trace))
    result = replay.run()
    journal = [(e.kind, e.program_id, e.worker, e.detail) for e in replay.core.journal]
    makespan = max(replay.finished_at, 1e-9)
    return ParityRun(
        _compared(journal), replay.output_tokens / makespan, result.ttft_mean_s, result.requests, replay.ttft_by_program
    )


def _extend(program_id: str, context: list[int], agent_prefix: int, tokens: int) -> list[int]:
    """A prompt of exactly ``tokens`` ids: the program's context so far (the agent's shared
    prefix, then its earlier prompts and answers, so its KV is reused as the replay's engine
    reuses it), then new ids of its own."""
    if not context:
        context = list(range(1_000, 1_000 + min(agent_prefix, tokens)))
    own = (sum(map(ord, program_id)) * 7919) % 50_000 + 100_000 + len(context)
    return (context + [own + i for i in range(max(tokens - len(context), 0))])[:tokens]


class _Player:
    """One program of the trace played against the gateway, as an agent would. Each tool call
    ends at the instant it ends in the replay (``tool_ends``, seconds from the start), not its
    duration after the live model call returned: a live step's few milliseconds of HTTP then
    never add up over a program, and a 5 s step sees the same programs acting in both drivers."""

    def __init__(
        self, url: str, pid: str, trace: ProgramTrace, prefix: dict[str, int], delay_s: float, tool_ends: list[float]
    ) -> None:
        self.url, self.pid, self.trace, self.prefix, self.delay_s = url, pid, trace, prefix, delay_s
        self.tool_ends = tool_ends
        self.began = 0.0
        self.ttft: list[float] = []
        self.context: list[int] = []
        self.output_tokens = 0
        self.done_at = 0.0
        self.error: BaseException | None = None

    def events(self, client: httpx.Client, *events: dict[str, Any]) -> None:
        body = orjson.dumps([{"v": 1, "ts": time.time(), "program_id": self.pid, **e} for e in events])
        client.post(self.url + "/v1/events", content=body, headers={"content-type": "application/json"}).raise_for_status()

    def __call__(self) -> None:
        try:
            time.sleep(max(self.began + self.delay_s - time.time(), 0.0))
            with httpx.Client(timeout=120) as client:
                self.events(client, {"type": "program.start", "agent": self.trace.steps[0].agent})
                ending: list[dict[str, Any]] = []
                for n, step in enumerate(self.trace.steps):
                    self.step(client, step.agent, step.input_tokens, step.output_tokens)
                    for k, tool in enumerate(step.tools):
                        call = f"c{n}.{k}"
                        self.events(client, {"type": "tool.start", "call_id": call, "tool": tool.name, "agent": step.agent})
                        ends = self.began + self.tool_ends.pop(0)
                        time.sleep(max(ends - time.time(), 0.0))
                        ending = [{"type": "tool.end", "call_id": call, "status": "ok", "duration_s": tool.duration_s}]
                        if n + 1 < len(self.trace.steps) or k + 1 < len(step.tools):
                            self.events(client, *ending)
                            ending = []
                # the last tool's end and the program's end in one batch, as the replay has them at one instant
                self.events(client, *ending, {"type": "program.end", "status": "ok"})
                self.done_at = time.time()
        except BaseException as exc:  # reported by the caller, which joins every thread first
            self.error = exc

    def step(self, client: httpx.Client, agent: str, tokens: int, output: int) -> None:
        ids = _extend(self.pid, self.context, self.prefix.get(agent, 0), tokens)
        body = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": output, "ignore_eos": True}}
        started = time.perf_counter()
        first: float | None = None
        answer: list[int] = []
        with client.stream(
            "POST",
            self.url + "/generate",
            content=orjson.dumps(body),
            headers={"content-type": "application/json", PROGRAM_HEADER: self.pid},
        ) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                first = first if first is not None else time.perf_counter() - started
                answer = orjson.loads(line[6:]).get("output_ids") or answer
        self.ttft.append(first if first is not None else time.perf_counter() - started)
        self.context = ids + answer
        self.output_tokens += output


def _steps_taken(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("maitred_scheduler_tick_seconds_count"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _after_a_step(url: str) -> None:
    """Return just after the gateway's next periodic step, so its steps keep the replay's phase:
    a 5 s period seen from a different phase pauses a different program."""
    seen = _steps_taken(url)
    while _steps_taken(url) == seen:
        time.sleep(0.005)


def live_side(trace: Trace, setup: ParitySetup) -> ParityRun:
    from maitred.gateway.app import ServeConfig, build_app
    from maitred.gateway.loop import LiveConfig
    from maitred.harness.background import BackgroundServer
    from maitred.sim.worker.app import create_app
    from maitred.sim.worker.config import SimWorkerConfig

    replay = Replay(trace, setup.run_config(trace))  # the slots' order, the workers, and when each tool ends
    replay.run()
    host = int(setup.gpu_tokens * setup.cpu_ratio) if replay.sim.offload else 0
    write_policy = "write_back" if replay.state.workers["w0"].write_back else "write_through"
    with ExitStack() as stack:
        sims = [
            stack.enter_context(
                BackgroundServer(
                    create_app(
                        SimWorkerConfig(
                            gpu_tokens=setup.gpu_tokens,
                            cpu_tokens=host,
                            hicache_write_policy=write_policy,
                            radix_eviction_policy="priority" if replay.sim.typed else "lru",
                            port=0,
                        )
                    )
                )
            )
            for _ in range(setup.workers)
        ]
        names = {s.url: f"w{i}" for i, s in enumerate(sorted(sims, key=lambda s: s.url))}
        runtime = LiveConfig(policy=replay.sim.runtime, priority=replay.core.cfg.priorities, journal=True, poll_s=0.5)
        gateway = build_app(ServeConfig(sorted(names), db_url=None, wait_for_workers_s=10, runtime=runtime))
        server = stack.enter_context(BackgroundServer(gateway.app))
        pids = [f"{trace.programs[i].program_id}#{slot}" for slot, i in enumerate(replay.order)]
        players = [
            _Player(
                server.url,
                pid,
                trace.programs[i],
                trace.prefix_tokens,
                slot * setup.start_gap_s,
                list(replay.tool_ends.get(pid, ())),
            )
            for slot, (i, pid) in enumerate(zip(replay.order, pids))
        ]
        _after_a_step(server.url)  # the replay's steps fall at 0, period, 2 × period, ... from its start
        began = time.time()
        for p in players:
            p.began = began
        threads = [threading.Thread(target=p, daemon=True) for p in players]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        failed = [p.error for p in players if p.error is not None]
        if failed:
            raise RuntimeError(f"a program failed against the gateway: {failed[0]!r}") from failed[0]
        journal = httpx.get(server.url + "/v1/journal", timeout=10).json()
    entries = [(e["kind"], e["program_id"], names.get(e["worker"], e["worker"]), e["detail"]) for e in journal]
    ttft = [x for p in players for x in p.ttft]
    makespan = max(max(p.done_at for p in players) - began, 1e-9)
    return ParityRun(
        _compared(entries),
        sum(p.output_tokens for p in players) / makespan,
        sum(ttft) / len(ttft),
        len(ttft),
        {p.pid: p.ttft for p in players},
    )
