"""Closed-loop replay: C program slots replay a trace against simulated workers under one policy.

Each slot runs programs back to back (the trace's programs in a seeded order, cycling) for the
simulated duration. A program's model calls go through the same ``RuntimeState`` and
``Scheduler`` the live runtime uses — the events are the same events — and the decisions are
applied to the engine model: routing, admission (held requests wait for the next step, and are
forced through after the policy's hold bound, like ThunderAgent's force-resume), tier moves,
eviction priorities and warmups. Tool calls take their traced durations; model calls take what
the engine model says. Deterministic for a seed.

Each policy runs at its own cadence and hold bound (``SimPolicy``), as published:

- ThunderAgent (ThunderAgent-org/ThunderAgent ``ThunderAgent/config.py``: ``scheduler_interval``
  5.0 s; ``ThunderAgent/scheduler/router.py``: ``_wait_for_resume(timeout=1800.0)``): a step every
  5 s, a held request forced in after 1,800 s; a new program is assigned when its first request
  arrives if nothing is paused (``admit_at_arrival``), else it waits for a resume.
- MORI (arXiv 2026, "How MORI Works": built on ThunderAgent's scheduler, "the scheduler runs
  asynchronously with a default 5-second period"): 5 s, 1,800 s, ThunderAgent's arrival rule.
- SGLang's router (round_robin, cache_aware) routes each request as it arrives: a step at once.
- TAO is our own composition (no published cadence): 1 s, ThunderAgent's 1,800 s bound.
- maitred: 1 s, and a step 50 ms after a held request arrives (the gateway admits a request
  that fits at once), held requests let through after 1,800 s (measured: at 60 s the forced
  requests overfill the GPU, 443 against 796 tok/s at synthetic C=80 ×1, 1,200 s; the gateway's own
  default, 5 s, is set in maitred/gateway/loop.py). A new program's first request is
  placed when it arrives if it fits and jumps no queue (``Maitred.admit_at_arrival``). A 5 s
  period measured the same on the H100 profile but lost a third of the throughput on the 70B
  one (SWE-agent C=80 ×1, 1,200 s: 427 against 662 tok/s).
"""

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from maitred.events import Handoff, LLMEnd, ProgramEnd, ProgramResume, ProgramStart, ProgramWait, ToolEnd, ToolProgress, ToolStart
from maitred.runtime import RuntimeState, Scheduler, SignalConfig, Tier, WorkerState
from maitred.runtime.decisions import Decision
from maitred.runtime.hicache import write_back_for
from maitred.runtime.policies import Maitred, Policy
from maitred.runtime.policies.clairvoyant import Clairvoyant
from maitred.sim.engine import Request, Worker
from maitred.sim.profile import EngineProfile
from maitred.sim.traces import ProgramTrace, Trace

UNLIMITED_TOKENS = 10**12
#: MORI's inverted order on the host side: dropped programs go first, then the host copies of
#: GPU-tier programs (they are on the GPU anyway), and the host tier's own programs last.
HOST_RANK = {Tier.WAITING: 0, Tier.GPU: 1, Tier.CPU: 2}


@dataclass(frozen=True, slots=True)
class SimPolicy:
    """How a simulator policy maps onto a runtime policy and the engine's own behaviour."""

    runtime: str
    offload: bool = False        # HiCache: host memory under the GPU's KV cache
    write_back: bool = False     # HiCache ``--hicache-write-policy write_back`` where maitred picks it
                                 # (``maitred.runtime.hicache``), else SGLang's default write_through
    typed: bool = False          # eviction follows the scheduler's priorities
    tiering: bool = False        # promotions load KV back from host memory ahead of the request
    oracle: bool = False         # the runtime is told each tool's true duration
    labels: bool = False         # MORI's engine patch: tier labels on the cache (may go down; host
                                 # copies of GPU-tier programs are dropped first); else priorities
                                 # ride on requests and ratchet (stock SGLang)
    period_s: float = 1.0        # scheduling period
    hold_s: float = 1800.0       # a held request is forced in after this long
    urgent_s: float | None = None  # a step this soon after a held request arrives (None: none)
    handoff_step: bool = False     # also a step ``urgent_s`` after a handoff (maitred's gateway steps on every event)
    arrival_admission: bool = False  # the policy's ``admit_at_arrival`` runs when a request arrives
    preprefill: bool = True      # maitred's warmups (off: the same policy without pre-prefill, to measure them)

    def __post_init__(self) -> None:
        if not self.preprefill and self.runtime != "maitred":
            raise ValueError(f"preprefill: only the maitred runtime policy has warmups to turn off, not {self.runtime!r}")


TA_PERIOD_S, TA_HOLD_S = 5.0, 1800.0
MAITRED_PERIOD_S, MAITRED_HOLD_S, MAITRED_URGENT_S = 1.0, 1800.0, 0.05
CLAIRVOYANT_PERIOD_S = 1.0
MAITRED_SIM = SimPolicy("maitred", offload=True, write_back=True, typed=True, tiering=True, period_s=MAITRED_PERIOD_S,
                        hold_s=MAITRED_HOLD_S, urgent_s=MAITRED_URGENT_S, arrival_admission=True, handoff_step=True)

SIM_POLICIES: dict[str, SimPolicy] = {
    "round_robin": SimPolicy("round_robin", urgent_s=0.0),
    "cache_aware": SimPolicy("cache_aware", urgent_s=0.0),
    "thunderagent": SimPolicy("thunderagent", period_s=TA_PERIOD_S, hold_s=TA_HOLD_S, arrival_admission=True),
    "thunderagent_offload": SimPolicy("thunderagent", offload=True, period_s=TA_PERIOD_S, hold_s=TA_HOLD_S,
                                      arrival_admission=True),
    "tao": SimPolicy("tao", hold_s=TA_HOLD_S),
    "mori": SimPolicy("mori", offload=True, typed=True, tiering=True, labels=True, period_s=TA_PERIOD_S,
                      hold_s=TA_HOLD_S, arrival_admission=True),
    "maitred": MAITRED_SIM,
    # maitred with its warmups off: what pre-prefill is worth, measured against ``maitred``
    "maitred_no_preprefill": replace(MAITRED_SIM, preprefill=False),
    # maitred on workers left at HiCache's default write_through: what write_back is worth
    "maitred_write_through": replace(MAITRED_SIM, write_back=False),
    "oracle": replace(MAITRED_SIM, oracle=True),
    # the reference every policy is read against: told each program's next request time, on
    # the workers maitred runs (write-back below 2× host: more room for it too)
    "clairvoyant": SimPolicy("clairvoyant", offload=True, write_back=True, typed=True, tiering=True, labels=True,
                             period_s=CLAIRVOYANT_PERIOD_S, hold_s=TA_HOLD_S, urgent_s=MAITRED_URGENT_S),
}

#: maitred with one of its parts turned off, asked for by name (e.g. on the handoff workload)
ABLATIONS = frozenset({"maitred_no_preprefill", "maitred_write_through"})
#: What ``maitred bench replay`` runs unless told: every policy but the ablation variants.
DEFAULT_POLICIES = tuple(name for name in SIM_POLICIES if name not in ABLATIONS)


@dataclass(frozen=True, slots=True)
class RunConfig:
    policy: str
    concurrency: int
    cpu_ratio: float = 1.0
    duration_s: float = 3600.0
    seed: int = 0
    workers: int = 1
    gpu_tokens: int | None = None   # per worker; None: the profile's
    period_s: float | None = None        # None: the policy's own
    hold_timeout_s: float | None = None  # None: the policy's own
    stagger_s: float = 30.0         # slots start spread over this window
    use_signature: bool = True      # readiness history per tool signature (else per tool; SPEC 7.2)
    busy_margin: float | None = None          # maitred's tier sizing (None: SignalConfig's default)
    overcommit_headroom: float | None = None

    def __post_init__(self) -> None:
        if self.policy not in SIM_POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from: {', '.join(SIM_POLICIES)}")
        if self.concurrency < 1 or self.workers < 1:
            raise ValueError("concurrency and workers must be at least 1")
        if self.cpu_ratio < 0 or self.duration_s <= 0 or (self.period_s is not None and self.period_s <= 0):
            raise ValueError("cpu_ratio must be >= 0; duration_s and period_s positive")
        if self.hold_timeout_s is not None and self.hold_timeout_s < 0:
            raise ValueError("hold_timeout_s must be >= 0")

    @property
    def period(self) -> float:
        return self.period_s if self.period_s is not None else SIM_POLICIES[self.policy].period_s

    @property
    def sizing(self) -> dict[str, Any]:
        """maitred's GPU-tier sizing overrides, for ``SignalConfig``."""
        return {name: value for name, value in (("busy_margin", self.busy_margin),
                                                ("overcommit_headroom", self.overcommit_headroom)) if value is not None}

    @property
    def hold(self) -> float:
        return self.hold_timeout_s if self.hold_timeout_s is not None else SIM_POLICIES[self.policy].hold_s


@dataclass
class RunResult:
    policy: str
    concurrency: int
    cpu_ratio: float
    throughput_tok_s: float
    ttft_mean_s: float
    ttft_p95_s: float
    latency_mean_s: float | None
    latency_p95_s: float | None
    prefix_hit_rate: float
    recomputed_tokens: int
    transfer_bytes: int
    tier_moves: int
    requests: int
    programs_completed: int
    warmups: int
    dp_fallback_share: float | None
    prediction_mae_s: float | None
    prediction_within_half_s: float | None
    gpu_tokens: int
    workers: int
    duration_s: float
    seed: int
    unlimited: bool = False
    handoff_ttft_mean_s: float | None = None  # first request of the agent a handoff went to
    handoff_requests: int = 0


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
            raise ValueError(f"gpu_tokens: {gpu:,} per worker cannot hold the trace's longest step "
                             f"({longest:,} tokens of prompt and output); raise --gpu-tokens or use another profile")
        self.gpu_tokens = gpu
        write_back = self.sim.write_back and write_back_for(cfg.cpu_ratio)
        self.workers = {
            f"w{i}": Worker(f"w{i}", profile, gpu, host, offload=self.sim.offload, typed_eviction=self.sim.typed,
                            host_evicts_gpu_copies=self.sim.labels, write_back=write_back)
            for i in range(cfg.workers)
        }
        self.state = RuntimeState(
            [WorkerState(w, gpu_tokens=gpu, cpu_tokens=host, write_back=write_back) for w in self.workers],
            replace(SignalConfig(period_s=cfg.period), **cfg.sizing), use_signature=cfg.use_signature,
        )
        self.clairvoyant = Clairvoyant() if self.sim.runtime == "clairvoyant" else None
        policy: Policy | str = self.clairvoyant or self.sim.runtime
        if not self.sim.preprefill:
            policy = Maitred(preprefill=False)
        self.scheduler = Scheduler(self.state, policy)
        self.heap: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.versions = dict.fromkeys(self.workers, 0)
        self.running: dict[str, _Running] = {}
        self.held: dict[str, Request] = {}
        self.admitted: frozenset[str] = frozenset()
        self.order = list(range(len(self.trace.programs)))
        self.rng.shuffle(self.order)
        self.next_program = 0
        self.instances = itertools.count()
        self.ttft: list[float] = []
        self.handoff_ttft: list[float] = []
        # a handed-off program until its consumer's first request: None, then that request
        self.consumers: dict[str, Request | None] = {}
        self.latency: list[float] = []
        self.output_tokens = 0
        self.requests = 0
        self.tier_moves = 0
        self.urgent_tick_at: float | None = None
        self.priorities: dict[str, int] = {}

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
            self._start_program(slot, self.rng.uniform(0, self.cfg.stagger_s))
        self._push(0.0, "tick", None)
        end = self.cfg.duration_s
        while self.heap:
            t, _, kind, data = heapq.heappop(self.heap)
            if t > end:
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
        self.state.apply(ProgramStart(ts=max(t, 1e-6), program_id=pid, agent=trace.steps[0].agent))
        self._push(t, "arrival", run)

    def _on_arrival(self, t: float, run: _Running) -> None:
        step = run.trace.steps[run.step]
        ts = max(t, 1e-6)
        self.state.request_arrived(run.pid, ts, agent=step.agent, prompt_tokens=step.input_tokens)
        req = Request(run.pid, step.agent, step.input_tokens, step.output_tokens, t,
                      prefix=self.trace.prefix_tokens.get(step.agent, 0))
        self.requests += 1
        if run.pid in self.consumers:
            self.consumers[run.pid] = req
        p = self.state.programs[run.pid]
        if run.pid in self.admitted and p.home_worker is not None:
            self._submit(p.home_worker, req, t)
            return
        if self.sim.arrival_admission and p.home_worker is None and self._admit_at_arrival(run.pid, t):
            self._submit(cast(str, self.state.programs[run.pid].home_worker), req, t)
            return
        self.held[run.pid] = req
        self._urgent_step(t)

    def _urgent_step(self, t: float) -> None:
        """A step soon after something the policy acts on before its next period: a held request
        (the gateway admits one that fits at once), or a handoff, whose consumer asks as soon as
        the producer's tools end (1.7 s on average in the synthetic trace, half of them under 1 s)."""
        if self.sim.urgent_s is not None and self.urgent_tick_at is None:
            self.urgent_tick_at = t + self.sim.urgent_s
            self._push(self.urgent_tick_at, "urgent", None)

    def _admit_at_arrival(self, pid: str, t: float) -> bool:
        """The policy's own rule for a new program's first request (ThunderAgent assigns it at
        once when nothing is paused); the assignment is recorded as a decision."""
        self._observe_workers(t)
        view = self.state.view(t)
        decision = self.scheduler.policy.admit_at_arrival(view, pid)  # type: ignore[attr-defined]
        if decision is None:
            return False
        self.state.apply_decision(decision)
        self.admitted = self.admitted | {pid}
        return True

    def _submit(self, wid: str, req: Request, t: float) -> None:
        worker = self.workers[wid]
        worker.cancel_warmup(req.program_id)
        if self.sim.typed and not self.sim.labels and req.program_id in self.priorities:
            req.priority = self.priorities[req.program_id]
        self._finished(wid, worker.submit(req, t), t)

    def _finished(self, wid: str, done: list[Request], t: float) -> None:
        for req in done:
            if req.background is not None:
                continue
            assert req.first_token_at is not None and req.done_at is not None, "the engine returns finished requests"
            self.ttft.append(req.first_token_at - req.arrival)
            if req.program_id in self.consumers and self.consumers[req.program_id] is req:
                del self.consumers[req.program_id]
                self.handoff_ttft.append(req.first_token_at - req.arrival)
            self.output_tokens += req.output
            run = self.running[req.program_id]
            self.state.apply(LLMEnd(ts=max(req.done_at, 1e-6), program_id=run.pid, request_id=f"r{run.step}",
                                    prompt_tokens=req.context, completion_tokens=req.output,
                                    cached_tokens=req.hit_tokens, worker=wid))
            self._after_step(run, req.done_at)
        self._reschedule(wid)

    def _after_step(self, run: _Running, t: float) -> None:
        """The producer's last step is done: a handoff to the next step's agent happens now, while
        the tools run, which is when a warmup of the consumer's prompt can still help."""
        steps = run.trace.steps
        if run.step + 1 < len(steps) and steps[run.step + 1].agent != steps[run.step].agent:
            nxt, previous = steps[run.step + 1], steps[run.step].agent
            context = nxt.handoff_tokens or nxt.input_tokens
            self.state.apply(Handoff(ts=max(t, 1e-6), program_id=run.pid, agent=previous, from_agent=previous,
                                     to_agent=nxt.agent,
                                     context_tokens=max(context - self.trace.prefix_tokens.get(nxt.agent, 0), 0)))
            self.consumers[run.pid] = None
            if self.sim.handoff_step:
                self._urgent_step(t)
        if self.clairvoyant is not None:
            step = steps[run.step]
            if run.step + 1 < len(steps):
                self.clairvoyant.next_use[run.pid] = t + sum(tool.duration_s for tool in step.tools) + step.human_wait_s
            else:
                self.clairvoyant.next_use.pop(run.pid, None)
        run.tool = 0
        self._next_tool(run, t)

    def _next_tool(self, run: _Running, t: float) -> None:
        step = run.trace.steps[run.step]
        ts = max(t, 1e-6)
        if run.tool < len(step.tools):
            tool = step.tools[run.tool]
            run.call_seq += 1
            call_id = f"c{run.call_seq}"
            self.state.apply(ToolStart(ts=ts, program_id=run.pid, call_id=call_id, tool=tool.name,
                                       signature=tool.signature, deadline_s=tool.deadline_s))
            if self.sim.oracle:
                self.state.apply(ToolProgress(ts=ts, program_id=run.pid, call_id=call_id, fraction=0.0, eta_s=tool.duration_s))
            self._push(t + tool.duration_s, "tool_end", (run, call_id))
            return
        if step.human_wait_s > 0 and run.tool == len(step.tools):
            run.tool += 1
            self.state.apply(ProgramWait(ts=ts, program_id=run.pid))
            self._push(t + step.human_wait_s, "resume", run)
            return
        self._next_step(run, t)

    def _on_tool_end(self, t: float, data: tuple[_Running, str]) -> None:
        run, call_id = data
        self.state.apply(ToolEnd(ts=max(t, 1e-6), program_id=run.pid, call_id=call_id,
                                 duration_s=run.trace.steps[run.step].tools[run.tool].duration_s))
        run.tool += 1
        self._next_tool(run, t)

    def _on_resume(self, t: float, run: _Running) -> None:
        self.state.apply(ProgramResume(ts=max(t, 1e-6), program_id=run.pid))
        self._next_step(run, t)

    def _next_step(self, run: _Running, t: float) -> None:
        run.step += 1
        if run.step < len(run.trace.steps):
            self._on_arrival(t, run)
            return
        self.latency.append(t - run.started)
        self.state.apply(ProgramEnd(ts=max(t, 1e-6), program_id=run.pid))
        for wid, worker in self.workers.items():
            worker.remove(run.pid)
            self._reschedule(wid)
        self.priorities.pop(run.pid, None)
        self.consumers.pop(run.pid, None)
        del self.running[run.pid]
        self._start_program(run.slot, t)

    # -- scheduling -----------------------------------------------------------------------------

    def _observe_workers(self, t: float) -> None:
        for wid, worker in self.workers.items():
            self._finished(wid, worker.advance(t), t)
            self.state.observe_worker(wid, queued_requests=worker.queued_foreground(), used_tokens=worker.locked_tokens(),
                                      warmups_in_flight=sum(1 for r in worker.running if r.background is not None))

    def _tick(self, t: float, *, periodic: bool) -> None:
        self._observe_workers(t)
        decision = self.scheduler.tick(t)
        self._apply(decision, t)
        if periodic:
            self._push(t + self.cfg.period, "tick", None)

    def _apply(self, decision: Decision, t: float) -> None:
        self.admitted = decision.admitted
        touched: set[str] = set()
        # Demotions and pauses are not commands to the engine (SGLang has none): they change the
        # priorities below, and the engine evicts accordingly when it needs room.
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
        elif self.sim.typed:  # stock SGLang: the priority rides on the program's next request
            self.priorities = dict(decision.priorities)
        for warm in decision.warmups:
            worker = self.workers[warm.worker]
            touched.add(warm.worker)
            if warm.kind == "load_back":
                worker.promote(warm.program_id, t)
            else:
                worker.warm(warm.program_id, warm.agent or "agent", warm.tokens,
                            self.trace.prefix_tokens.get(warm.agent or "", 0), t)
        for pid, req in list(self.held.items()):
            p = self.state.programs.get(pid)
            home = p.home_worker if p is not None else None
            if pid in self.admitted and home is not None:
                del self.held[pid]
                self._submit(home, req, t)
            elif t - req.arrival >= self.cfg.hold:
                del self.held[pid]
                target = home or self._least_loaded()
                self.state.force_admit(pid, target)
                self._submit(target, req, t)
        for wid in touched:
            self._reschedule(wid)

    def _least_loaded(self) -> str:
        return min(sorted(self.workers), key=lambda w: self.workers[w].gpu_used)

    # -- results --------------------------------------------------------------------------------

    def _result(self) -> RunResult:
        stats = [w.stats for w in self.workers.values()]
        prompt = sum(s.prompt_tokens for s in stats)
        ttft = np.array(self.ttft) if self.ttft else np.array([math.nan])
        latency = np.array(self.latency) if self.latency else None
        preds = self.state.predictions
        return RunResult(
            policy=self.cfg.policy, concurrency=self.cfg.concurrency, cpu_ratio=self.cfg.cpu_ratio,
            throughput_tok_s=self.output_tokens / self.cfg.duration_s,
            ttft_mean_s=float(ttft.mean()), ttft_p95_s=float(np.percentile(ttft, 95)),
            latency_mean_s=float(latency.mean()) if latency is not None else None,
            latency_p95_s=float(np.percentile(latency, 95)) if latency is not None else None,
            prefix_hit_rate=sum(s.hit_tokens for s in stats) / prompt if prompt else 0.0,
            recomputed_tokens=sum(s.recomputed_tokens for s in stats),
            transfer_bytes=sum(s.transfer_bytes for s in stats),
            tier_moves=self.tier_moves, requests=self.requests, programs_completed=len(self.latency),
            warmups=sum(s.warmups for s in stats),
            dp_fallback_share=self.scheduler.dp_fallbacks / self.scheduler.dp_steps if self.scheduler.dp_steps else None,
            prediction_mae_s=preds.mae_s, prediction_within_half_s=preds.within_half_second_share,
            gpu_tokens=self.gpu_tokens, workers=self.cfg.workers, duration_s=self.cfg.duration_s, seed=self.cfg.seed,
            unlimited=self.unlimited,
            handoff_ttft_mean_s=float(np.mean(self.handoff_ttft)) if self.handoff_ttft else None,
            handoff_requests=len(self.handoff_ttft),
        )


def run_one(trace: Trace, cfg: RunConfig, profile: EngineProfile | None = None, *, unlimited: bool = False) -> RunResult:
    return Replay(trace, cfg, profile or EngineProfile(), unlimited=unlimited).run()
