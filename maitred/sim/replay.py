"""Closed-loop replay: C program slots replay a trace against simulated workers under one policy.

Each slot runs programs back to back (the trace's programs in a seeded order, cycling) for the
simulated duration. A program's model calls go through the same ``RuntimeCore`` the gateway
drives (``maitred/runtime/core.py``: admission at arrival, holding and forced admission, the
plan re-check, priorities under SGLang's ratchet, which warmups can be sent) — the events are
the same events — and its decisions are applied to the engine model: routing, tier moves,
eviction priorities and warmups. Tool calls take their traced durations; model calls take what
the engine model says. Deterministic for a seed.

Each policy runs at its own cadence and hold bound (``Policy.cadence``, each with its source),
in the gateway as here: ThunderAgent and MORI step every 5 s and let a held request through
after 1,800 s; TAO every 1 s; maitred every 1 s and 50 ms after a request is held or a handoff
arrives, with the same 1,800 s hold (``maitred.runtime.admission.HOLD_TIMEOUT_S``). A new
program's first request is admitted by the policy's own arrival rule where it has one.

The replay holds every prompt it replays, so a warmup the core admits is always sendable: a
handoff's consumer is warmed as if the producer declared its prompt (``expected_prompt``,
LOCAL's API), which the gateway requires live.
"""

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from maitred.events import Handoff, LLMEnd, ProgramResume, ProgramStart, ProgramWait, ToolEnd, ToolProgress, ToolStart
from maitred.runtime import RuntimeState, SignalConfig, Tier, WorkerState
from maitred.runtime.core import RuntimeCore, StepResult
from maitred.runtime.hicache import write_back_for
from maitred.runtime.policies import Policy
from maitred.runtime.policies.belady import Belady
from maitred.sim.engine import Request, WorkerModel
from maitred.sim.profile import EngineProfile
from maitred.sim.replay_config import ABLATIONS, DEFAULT_POLICIES, SIM_POLICIES, RunConfig, RunResult, SimPolicy
from maitred.sim.replay_spans import ReplaySpans
from maitred.sim.traces import ProgramTrace, Trace

UNLIMITED_TOKENS = 10**12
__all__ = ["ABLATIONS", "DEFAULT_POLICIES", "SIM_POLICIES", "Replay", "RunConfig", "RunResult", "SimPolicy", "run_one"]
#: MORI's inverted order on the host side: dropped programs go first, then the host copies of
#: GPU-tier programs (they are on the GPU anyway), and the host tier's own programs last.
HOST_RANK = {Tier.WAITING: 0, Tier.GPU: 1, Tier.CPU: 2}


@dataclass(slots=True)
class _Running:
    pid: str
    trace: ProgramTrace
    slot: int
    started: float
    step: int = 0
    tool: int = 0
    call_seq: int = 0


@dataclass
class Replay:
    trace: Trace
    cfg: RunConfig
    profile: EngineProfile = field(default_factory=EngineProfile)
    unlimited: bool = False

    def __post_init__(self) -> None:
        cfg, profile = self.cfg, self.profile
        self.sim = SIM_POLICIES[cfg.policy]
        self.rng = random.Random(cfg.seed)
        gpu = UNLIMITED_TOKENS if self.unlimited else (cfg.gpu_tokens or profile.gpu_kv_tokens)
        host = int(gpu * cfg.cpu_ratio) if self.sim.offload else 0
        longest = max(s.input_tokens + s.output_tokens for p in self.trace.programs for s in p.steps)
        if longest > gpu:
            raise ValueError(
                f"gpu_tokens: {gpu:,} per worker cannot hold the trace's longest step "
                f"({longest:,} tokens of prompt and output); raise --gpu-tokens or use another profile"
            )
        self.gpu_tokens = gpu
        write_back = self.sim.write_back and write_back_for(cfg.cpu_ratio)
        self.workers = {
            f"w{i}": WorkerModel(
                f"w{i}",
                profile,
                gpu,
                host,
                offload=self.sim.offload,
                typed_eviction=self.sim.typed,
                host_evicts_gpu_copies=self.sim.labels,
                write_back=write_back,
            )
            for i in range(cfg.workers)
        }
        self.state = RuntimeState(
            [WorkerState(w, gpu_tokens=gpu, cpu_tokens=host, write_back=write_back) for w in self.workers],
            replace(SignalConfig(period_s=cfg.period), **cfg.sizing),
            use_signature=cfg.use_signature,
        )
        self.belady = Belady() if self.sim.runtime == "belady" else None
        policy: Policy = self.belady or self.sim.policy()
        self.core = RuntimeCore(self.state, policy, cfg.core_config(), started_at=0.0)
        self.scheduler = self.core.scheduler
        self.heap: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.versions = dict.fromkeys(self.workers, 0)
        self.running: dict[str, _Running] = {}
        self.held: dict[str, Request] = {}
        self.order = list(range(len(self.trace.programs)))
        if not cfg.once:
            self.rng.shuffle(self.order)
        self.finished_at = 0.0
        self.next_program = 0
        self.instances = itertools.count()
        self.ttft: list[float] = []
        self.ttft_by_program: dict[str, list[float]] = {}
        #: when each tool call ends, per program in order (``once`` runs: the parity harness plays
        #: the live side to these instants, so its lag does not add up from step to step)
        self.tool_ends: dict[str, list[float]] = {}
        self.handoff_ttft: list[float] = []
        # a handed-off program until its consumer's first request: None, then that request
        self.consumers: dict[str, Request | None] = {}
        self.latency: list[float] = []
        self.output_tokens = 0
        self.requests = 0
        self.tier_moves = 0
        self.urgent_tick_at: float | None = None
        #: model calls, tool calls and handoffs as they ran, with the journal (``maitred bench replay --perfetto``)
        self.spans: ReplaySpans | None = ReplaySpans() if cfg.journal else None

    # -- event queue ----------------------------------------------------------------------------

    def _push(self, t: float, kind: str, data: object) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, data))

    def _reschedule(self, wid: str) -> None:
        self.versions[wid] += 1
        nxt = self.workers[wid].next_event_time()
        if nxt is not None:
            self._push(nxt, "engine", (wid, self.versions[wid]))

    def run(self) -> RunResult:
        for slot in range(self.cfg.concurrency):
            self._start_program(slot, slot * self.cfg.start_gap_s if self.cfg.once else self.rng.uniform(0, self.cfg.stagger_s))
        self._push(0.0, "tick", None)
        end = self.cfg.duration_s
        while self.heap:
            t, _, kind, data = heapq.heappop(self.heap)
            if t > end or (self.cfg.once and not self.running):
                break
            if kind == "engine":
                wid, version = cast(tuple[str, int], data)
                if version == self.versions[wid]:
                    self._finished(wid, self.workers[wid].advance(t), t)
            elif kind == "tick":
                self._tick(t, periodic=True)
            elif kind == "urgent":
                self.urgent_tick_at = None
                self._tick(t, periodic=False)
            else:
                getattr(self, f"_on_{kind}")(t, data)
        return self._result()

    # -- programs -------------------------------------------------------------------------------

    def _start_program(self, slot: int, t: float) -> None:
        trace = self.trace.programs[self.order[self.next_program % len(self.order)]]
        self.next_program += 1
        pid = f"{trace.program_id}#{next(self.instances)}"
        run = self.running[pid] = _Running(pid, trace, slot, t)
        self._push(t, "start", run)

    def _on_start(self, t: float, run: _Running) -> None:
        """The program begins at its own time (a slot staggered 20 s in does not exist before)."""
        self.core.observe(ProgramStart(ts=max(t, 1e-6), program_id=run.pid, agent=run.trace.steps[0].agent))
        self._on_arrival(t, run)

    def _on_arrival(self, t: float, run: _Running) -> None:
        step = run.trace.steps[run.step]
        ts = max(t, 1e-6)
        req = Request(
            run.pid, step.agent, step.input_tokens, step.output_tokens, t, prefix=self.trace.prefix_tokens.get(step.agent, 0)
        )
        self.requests += 1
        if run.pid in self.consumers:
            self.consumers[run.pid] = req
        self._observe_workers(t)
        for engine in self.workers.values():  # overtaken by the real request: the warmup is moot (as live)
            engine.cancel_warmup(run.pid)
        self.core.warming(run.pid, False)
        worker = self.core.arrive(run.pid, ts, agent=step.agent, prompt_tokens=step.input_tokens).worker
        self.core.prompt_seen(run.pid)
        if worker is not None:
            self._submit(worker, req, t)
            return
        self.held[run.pid] = req
        self._push(max(self.core.hold_deadline(run.pid), t), "hold_expired", req)
        self._urgent_step(t)

    def _urgent_step(self, t: float) -> None:
        """A step ``urgent_s`` after a request is held or a handoff arrives, for policies that
        have one (the gateway asks for the same): a handoff's consumer asks as soon as the
        producer's tools end (1.7 s on average in the synthetic trace, half of them under 1 s)."""
        urgent = self.core.cadence.urgent_s
        if urgent is not None and self.urgent_tick_at is None:
            self.urgent_tick_at = t + urgent
            self._push(self.urgent_tick_at, "urgent", None)

    def _on_hold_expired(self, t: float, req: Request) -> None:
        """The held request's bounded wait is over: the core lets it through (``RuntimeCore.force``)."""
        if self.held.get(req.program_id) is not req:
            return
        del self.held[req.program_id]
        self._observe_workers(t)
        worker = self.core.force(req.program_id, t, load=self._in_flight())
        assert worker is not None, "the simulated workers never fail"
        self._submit(worker, req, t)

    def _in_flight(self) -> dict[str, int]:
        """Foreground requests running or queued per worker: what the gateway counts in flight."""
        return {wid: sum(1 for r in w.running if r.background is None) + w.queued_foreground() for wid, w in self.workers.items()}

    def _submit(self, wid: str, req: Request, t: float) -> None:
        worker = self.workers[wid]
        priority = self.core.priority_for(req.program_id, wid, t)
        if priority is not None:
            req.priority = priority
        self._finished(wid, worker.submit(req, t), t)

    def _finished(self, wid: str, done: list[Request], t: float) -> None:
        for req in done:
            if req.background is not None:
                self.core.warming(req.program_id, False)
                continue
            assert req.first_token_at is not None and req.done_at is not None, "the engine returns finished requests"
            self.ttft.append(req.first_token_at - req.arrival)
            if self.cfg.once:
                self.ttft_by_program.setdefault(req.program_id, []).append(req.first_token_at - req.arrival)
            if req.program_id in self.consumers and self.consumers[req.program_id] is req:
                del self.consumers[req.program_id]
                self.handoff_ttft.append(req.first_token_at - req.arrival)
            self.output_tokens += req.output
            run = self.running[req.program_id]
            if self.spans is not None:
                self.spans.model_call(req, wid, f"r{run.step}")
            self.core.observe(
                LLMEnd(
                    ts=max(req.done_at, 1e-6),
                    program_id=run.pid,
                    request_id=f"r{run.step}",
                    prompt_tokens=req.context,
                    completion_tokens=req.output,
                    cached_tokens=req.hit_tokens,
                    worker=wid,
                )
            )
            self._after_step(run, req.done_at)
        self._reschedule(wid)

    def _after_step(self, run: _Running, t: float) -> None:
        """The producer's last step is done: a handoff to the next step's agent happens now, while
        the tools run, which is when a warmup of the consumer's prompt can still help."""
        steps = run.trace.steps
        if run.step + 1 < len(steps) and steps[run.step + 1].agent != steps[run.step].agent:
            nxt, previous = steps[run.step + 1], steps[run.step].agent
            context = nxt.handoff_tokens or nxt.input_tokens
            self.core.observe(
                Handoff(
                    ts=max(t, 1e-6),
                    program_id=run.pid,
                    agent=previous,
                    from_agent=previous,
                    to_agent=nxt.agent,
                    context_tokens=max(context - self.trace.prefix_tokens.get(nxt.agent, 0), 0),
                )
            )
            self.core.handoff_prompt_seen(run.pid)
            if self.spans is not None:
                self.spans.handoff(run.pid, t, previous, nxt.agent)
            self.consumers[run.pid] = None
            self._urgent_step(t)
        if self.belady is not None:
            step = steps[run.step]
            if run.step + 1 < len(steps):
                self.belady.next_use[run.pid] = t + sum(tool.duration_s for tool in step.tools) + step.human_wait_s
            else:
                self.belady.next_use.pop(run.pid, None)
        run.tool = 0
        self._next_tool(run, t)

    def _next_tool(self, run: _Running, t: float) -> None:
        step = run.trace.steps[run.step]
        ts = max(t, 1e-6)
        if run.tool < len(step.tools):
            tool = step.tools[run.tool]
            run.call_seq += 1
            call_id = f"c{run.call_seq}"
            if self.cfg.once:
                self.tool_ends.setdefault(run.pid, []).append(t + tool.duration_s)
            if self.spans is not None:
                self.spans.tool_call(run.pid, t, tool, call_id)
            self.core.observe(
                ToolStart(
                    ts=ts,
                    program_id=run.pid,
                    call_id=call_id,
                    tool=tool.name,
                    signature=tool.signature,
                    deadline_s=tool.deadline_s,
                )
            )
            if self.sim.oracle:
                self.core.observe(ToolProgress(ts=ts, program_id=run.pid, call_id=call_id, fraction=0.0, eta_s=tool.duration_s))
            self._push(t + tool.duration_s, "tool_end", (run, call_id))
            return
        if step.human_wait_s > 0 and run.tool == len(step.tools):
            run.tool += 1
            self.core.observe(ProgramWait(ts=ts, program_id=run.pid))
            self._push(t + step.human_wait_s, "resume", run)
            return
        self._next_step(run, t)

    def _on_tool_end(self, t: float, data: tuple[_Running, str]) -> None:
        run, call_id = data
        self.core.observe(
            ToolEnd(
                ts=max(t, 1e-6),
                program_id=run.pid,
                call_id=call_id,
                duration_s=run.trace.steps[run.step].tools[run.tool].duration_s,
            )
        )
        run.tool += 1
        self._next_tool(run, t)

    def _on_resume(self, t: float, run: _Running) -> None:
        self.core.observe(ProgramResume(ts=max(t, 1e-6), program_id=run.pid))
        self._next_step(run, t)

    def _next_step(self, run: _Running, t: float) -> None:
        run.step += 1
        if run.step < len(run.trace.steps):
            self._on_arrival(t, run)
            return
        self.latency.append(t - run.started)
        self.core.end(run.pid, max(t, 1e-6))
        for wid, worker in self.workers.items():
            worker.remove(run.pid)
            self._reschedule(wid)
        self.consumers.pop(run.pid, None)
        del self.running[run.pid]
        self.finished_at = t
        if not self.cfg.once:
            self._start_program(run.slot, t)

    # -- scheduling -----------------------------------------------------------------------------

    def _observe_workers(self, t: float) -> None:
        for wid, worker in self.workers.items():
            self._finished(wid, worker.advance(t), t)
            self.state.observe_worker(
                wid,
                queued_requests=worker.queued_foreground(),
                used_tokens=worker.locked_tokens(),
                warmups_in_flight=sum(1 for r in worker.running if r.background is not None),
            )

    def _tick(self, t: float, *, periodic: bool) -> None:
        self._observe_workers(t)
        self._apply(self.core.step(t), t)
        if periodic:
            self._push(t + self.core.cadence.period_s, "tick", None)

    def _apply(self, result: StepResult, t: float) -> None:
        """The step's decisions on the engine. Demotions and pauses are not commands to the
        engine (SGLang has none): they change the priorities, and the engine evicts accordingly
        when it needs room."""
        decision = result.decision
        touched: set[str] = set()
        for move in decision.tier_moves:
            if move.lazy:
                continue
            self.tier_moves += 1
            if move.dst is Tier.GPU and self.sim.tiering:
                self.workers[move.worker].promote(move.program_id, t)
                touched.add(move.worker)
        if self.sim.labels:
            ranks = {pid: HOST_RANK[p.tier] for pid, p in self.state.programs.items()}
            for worker in self.workers.values():
                worker.relabel(dict(decision.priorities), ranks)
        for warm in result.warmups:
            worker = self.workers[warm.worker]
            touched.add(warm.worker)
            if warm.kind == "load_back":
                worker.promote(warm.program_id, t)
            elif worker.warm(
                warm.program_id,
                warm.agent or "agent",
                warm.tokens,
                self.trace.prefix_tokens.get(warm.agent or "", 0),
                t,
                self.core.priority_for(warm.program_id, warm.worker, t),
            ):
                self.core.warming(warm.program_id, True)
                if warm.kind == "handoff":
                    self.core.handoff_warmed(warm.program_id)
        for pid, wid in result.released.items():
            req = self.held.pop(pid, None)
            if req is not None:
                self._submit(wid, req, t)
        for wid in touched:
            self._reschedule(wid)

    # -- results --------------------------------------------------------------------------------

    def _result(self) -> RunResult:
        stats = [w.stats for w in self.workers.values()]
        prompt = sum(s.prompt_tokens for s in stats)
        ttft = np.array(self.ttft) if self.ttft else np.array([math.nan])
        latency = np.array(self.latency) if self.latency else None
        preds = self.state.predictions
        return RunResult(
            policy=self.cfg.policy,
            concurrency=self.cfg.concurrency,
            cpu_ratio=self.cfg.cpu_ratio,
            throughput_tok_s=self.output_tokens / self.cfg.duration_s,
            ttft_mean_s=float(ttft.mean()),
            ttft_p95_s=float(np.percentile(ttft, 95)),
            latency_mean_s=float(latency.mean()) if latency is not None else None,
            latency_p95_s=float(np.percentile(latency, 95)) if latency is not None else None,
            prefix_hit_rate=sum(s.hit_tokens for s in stats) / prompt if prompt else 0.0,
            recomputed_tokens=sum(s.recomputed_tokens for s in stats),
            transfer_bytes=sum(s.transfer_bytes for s in stats),
            tier_moves=self.tier_moves,
            requests=self.requests,
            programs_completed=len(self.latency),
            warmups=sum(s.warmups for s in stats),
            dp_fallback_share=self.scheduler.dp_fallbacks / self.scheduler.dp_steps if self.scheduler.dp_steps else None,
            prediction_mae_s=preds.mae_s,
            prediction_within_half_s=preds.within_half_second_share,
            gpu_tokens=self.gpu_tokens,
            workers=self.cfg.workers,
            duration_s=self.cfg.duration_s,
            seed=self.cfg.seed,
            unlimited=self.unlimited,
            handoff_ttft_mean_s=float(np.mean(self.handoff_ttft)) if self.handoff_ttft else None,
            handoff_requests=len(self.handoff_ttft),
        )


def run_one(trace: Trace, cfg: RunConfig, profile: EngineProfile | None = None, *, unlimited: bool = False) -> RunResult:
    return Replay(trace, cfg, profile or EngineProfile(), unlimited=unlimited).run()
