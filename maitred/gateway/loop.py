"""The live runtime: the policy core driven by requests, events and a clock.

``Runtime`` owns the ``RuntimeState`` and mutates it only on the asyncio event loop, so no lock
is needed. A scheduler step is event-driven (a held request, a tool that ended, a worker that
failed) plus a periodic tick: the state is snapshotted on the loop (copy-on-write: cheap), the
policy runs on the snapshot in a worker thread so a 10,000-program step never stalls requests,
and the plan is re-checked against the live state before it is applied (``Scheduler.apply``).

Admission: a request whose program fits is let through at once (``RuntimeState.admit_now``);
otherwise it is held until a step admits its program, or for at most ``hold_timeout_s``, after
which it is let through anyway and the state records where (``force_admit``). A failed step is
logged and counted, and held requests are routed plainly — sticky to a healthy home, else to
the least loaded worker — so a scheduler bug never costs a request.
"""

import asyncio
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from maitred.events import Event, Handoff, LLMEnd, LLMStart, ProgramEnd, ToolEnd
from maitred.gateway.metrics import Metrics, Tally, program_counts
from maitred.gateway.sglang.client import SGLangWorker, WorkerProtocolError
from maitred.gateway.store_writer import StoreWriter
from maitred.gateway.usage import PromptSize
from maitred.runtime.decisions import Decision, Warmup
from maitred.runtime.hicache import WRITE_BACK_BELOW_RATIO, write_back_for
from maitred.runtime.records import HOLD_TIMEOUT_S, SignalConfig, Tier, WorkerState
from maitred.runtime.scheduler import Scheduler, free_after
from maitred.runtime.state import RuntimeState, Snapshot, View, pending_at

log = logging.getLogger("maitred.service")

#: Distinct tool names given their own label in the duration histogram; the rest share "other".
MAX_TOOL_LABELS = 200


class NoWorkerAvailable(RuntimeError):
    """Every worker is down: the request cannot be served (the gateway answers 503)."""


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    policy: str = "maitred"
    tick_s: float = 1.0              # periodic scheduler step
    min_gap_s: float = 0.01          # event-driven steps closer than this are coalesced
    hold_timeout_s: float = HOLD_TIMEOUT_S   # bounded wait of a held request before forced admission
    poll_s: float = 1.0              # worker health and load polling
    fail_after: int = 3              # failed health checks in a row before a worker is declared down
    priority: bool = False           # set SGLang's request priority (--radix-eviction-policy priority)
    priority_epoch_s: float = 10.0   # see Runtime.priority_for
    warmups: bool = True
    program_ttl_s: float = 3600.0    # programs silent this long are forgotten (no program.end came)
    busy_margin: float = SignalConfig().busy_margin              # maitred's GPU-tier sizing (tiering.py)
    overcommit_headroom: float = SignalConfig().overcommit_headroom

    def __post_init__(self) -> None:
        for name in ("tick_s", "hold_timeout_s", "poll_s", "priority_epoch_s", "program_ttl_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.fail_after < 1:
            raise ValueError("fail_after must be at least 1")


@dataclass(slots=True)
class Admission:
    worker: str
    waited_s: float
    forced: bool = False


@dataclass(slots=True)
class _Held:
    future: "asyncio.Future[str]"
    since: float


@dataclass(slots=True)
class _WorkerHealth:
    failures: int = 0
    known: bool = False   # capacity read at least once
    write_policy: str | None = None   # HiCache's, as /server_info says (None: off, or not said)
    warned: bool = False  # the write-policy warning was logged


@dataclass
class Runtime:
    backends: Mapping[str, SGLangWorker]
    cfg: RuntimeConfig = field(default_factory=RuntimeConfig)
    metrics: Metrics = field(default_factory=Metrics)
    writer: StoreWriter | None = None
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.state = RuntimeState([], SignalConfig(period_s=self.cfg.tick_s, busy_margin=self.cfg.busy_margin,
                                                   overcommit_headroom=self.cfg.overcommit_headroom))
        for url in self.backends:
            self.state.add_worker(WorkerState(url, gpu_tokens=0, healthy=False))
        self.scheduler = Scheduler(self.state, self.cfg.policy)
        self.decision: Decision | None = None
        self.inflight: Counter[str] = Counter()
        self.started_at = self.clock()
        self.steps_failed = 0
        self._held: dict[str, list[_Held]] = {}
        self._health = {url: _WorkerHealth() for url in self.backends}
        self._priorities: Mapping[str, int] = {}
        self.ratchet: dict[tuple[str, str], int] = {}   # (program, worker) -> highest priority sent
        self._prompts: dict[str, str | list[int]] = {}  # program -> its last text prompt (for warmups)
        self._handoff_prompts: dict[str, str] = {}  # consumer program -> a handoff's expected_prompt
        self.last_usage: dict[str, tuple[int, int | None]] = {}  # program -> (prompt, cached) tokens of its last answer
        self._chars_per_token: dict[str, float] = {}  # program -> learned from its answers (admission estimates)
        self._warming: dict[str, asyncio.Task[None]] = {}
        self._tool_labels: set[str] = set()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="maitred-scheduler")
        self._policy_failures_seen = 0
        self._voided_seen = 0
        self._stopping = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, *, wait_for_workers_s: float = 0.0) -> None:
        """Read each worker's capacity (a worker that does not answer starts as down and is
        polled), then start the scheduler and polling tasks."""
        deadline = time.monotonic() + wait_for_workers_s
        while True:
            await asyncio.gather(*(self._check(url) for url in self.backends))
            if any(w.healthy for w in self.state.workers.values()) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        self._tasks = [asyncio.create_task(self._tick_loop()), asyncio.create_task(self._poll_loop())]

    async def stop(self) -> None:
        self._stopping = True
        for task in [*self._tasks, *self._warming.values()]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._warming.values(), return_exceptions=True)
        for held in self._held.values():
            for h in held:
                if not h.future.done():
                    h.future.cancel()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def seed(self, rows: Iterable[Any], signature_rows: Iterable[Any] = ()) -> None:
        """Tool statistics from the store, so readiness predicts from the first call."""
        self.state.seed_history(rows)
        self.state.seed_history(signature_rows, signatures=True)

    # -- workers --------------------------------------------------------------------------------

    async def _check(self, url: str) -> None:
        backend, health, live = self.backends[url], self._health[url], self.state.workers[url]
        if not await backend.healthy():
            health.failures += 1
            if live.healthy and health.failures >= self.cfg.fail_after:
                self.worker_failed(url, reason="health check")
            return
        try:
            if not health.known or not live.healthy:
                await self._read_capacity(url)
            load = await backend.load()
        except (httpx.HTTPError, WorkerProtocolError) as exc:
            log.warning("maitred: worker %s answers /health but not %s", url, exc)
            return
        health.failures = 0
        self.state.observe_worker(url, queued_requests=load.waiting, used_tokens=load.used_tokens)
        if not live.healthy:
            hicache = f"HiCache {health.write_policy or 'write policy not reported'}" if live.cpu_tokens else "no host cache"
            log.info("maitred: worker %s is up (%d GPU tokens, %d host tokens, %s)", url, live.gpu_tokens, live.cpu_tokens,
                     hicache)
            self.state.set_worker_health(url, True)
            self.kick()

    async def _read_capacity(self, url: str) -> None:
        """GPU and host KV capacity, and whether the host pool adds to the GPU's (HiCache
        write-back) or mirrors it (write-through), from the worker's ``/server_info``. Under
        maitred, a worker on write-through whose host pool is small enough for maitred to pick
        write-back (``maitred.runtime.hicache``) is named once in a warning."""
        backend, health, live = self.backends[url], self._health[url], self.state.workers[url]
        cap = await backend.capacity()
        host = cap.host_tokens
        if host is None:
            host = await backend.host_capacity() or 0
        live.gpu_tokens, live.cpu_tokens, live.write_back = cap.gpu_tokens, host, cap.write_back
        health.known, health.write_policy = True, cap.write_policy
        ratio = host / cap.gpu_tokens if cap.gpu_tokens else 0.0
        if self.cfg.policy == "maitred" and host and not cap.write_back and write_back_for(ratio) and not health.warned:
            health.warned = True
            log.warning("maitred: worker %s keeps a host KV pool of %.3g GPUs without --hicache-write-policy write_back "
                        "(%s): host memory mirrors the GPU, so maitred counts only the part beyond the GPU's size; "
                        "start SGLang with --hicache-write-policy write_back (as maitred sglang-args does for a host "
                        "pool under %g GPUs) to count all of it, at the cost of an eviction waiting for its copy to "
                        "host memory", url, ratio, cap.write_policy or "write policy not reported", WRITE_BACK_BELOW_RATIO)

    def worker_failed(self, url: str, *, reason: str) -> None:
        """``url`` is down: its programs lose their KV and become homeless, to be placed on
        another worker by the next step (which this triggers)."""
        self.metrics.worker_failures.labels(url).inc()
        if self.state.workers[url].healthy:
            log.warning("maitred: worker %s is down (%s); re-placing its programs", url, reason)
            self.state.set_worker_health(url, False)
            self._health[url].failures = max(self._health[url].failures, self.cfg.fail_after)
            self.kick()

    async def _poll_loop(self) -> None:
        last_sweep = self.clock()
        while True:
            await asyncio.sleep(self.cfg.poll_s)
            try:
                await asyncio.gather(*(self._check(url) for url in self.backends))
                now = self.clock()
                if now - last_sweep >= min(60.0, self.cfg.program_ttl_s):
                    last_sweep = now
                    self._forget_silent(now)
            except Exception:
                log.exception("maitred: worker polling failed")

    def _forget_silent(self, now: float) -> None:
        stale = [pid for pid, p in self.state.programs.items()
                 if now - p.phase_since > self.cfg.program_ttl_s and pid not in self._held]
        for pid in stale:
            self._end(pid, now)

    def no_worker(self) -> NoWorkerAvailable:
        """Why no worker can take a request, naming the workers that do not answer."""
        down = [url for url, w in self.state.workers.items() if not w.healthy]
        return NoWorkerAvailable("no healthy worker" + (f" (not answering: {', '.join(down)})" if down else ""))

    def least_loaded(self) -> str:
        healthy = [url for url, w in self.state.workers.items() if w.healthy]
        if not healthy:
            raise self.no_worker()
        return min(healthy, key=lambda url: (self.inflight[url], self.state.workers[url].queued_requests, url))

    # -- requests -------------------------------------------------------------------------------

    async def admit(self, program_id: str, *, request_id: str, agent: str | None, model: str | None,
                    prompt_tokens: int | None, store: bool = True) -> Admission:
        """Wait until ``program_id`` may run, and say where."""
        now = self.clock()
        event = LLMStart(ts=now, program_id=program_id, agent=agent, request_id=request_id, model=model,
                         prompt_tokens=prompt_tokens)
        self.state.apply(event)
        if store and self.writer is not None:
            self.writer.submit([event])
        self._handoff_prompts.pop(program_id, None)  # the consumer asked: its warmup is moot
        warming = self._warming.pop(program_id, None)
        if warming is not None:  # overtaken by the real request: the warmup is moot
            warming.cancel()
        worker = self.state.admit_now(program_id) or self._place_at_arrival(program_id)
        if worker is not None:
            self.metrics.queue_wait.observe(0.0)
            return Admission(worker, 0.0)
        if not any(w.healthy for w in self.state.workers.values()):
            raise self.no_worker()
        held = _Held(asyncio.get_running_loop().create_future(), time.monotonic())
        self._held.setdefault(program_id, []).append(held)
        self.kick()
        forced = False
        try:
            worker = await asyncio.wait_for(asyncio.shield(held.future), self.cfg.hold_timeout_s)
        except TimeoutError:
            worker, forced = self._force(program_id), True
        finally:
            waiters = self._held.get(program_id)
            if waiters is not None:
                waiters.remove(held)
                if not waiters:
                    del self._held[program_id]
        waited = time.monotonic() - held.since
        self.metrics.queue_wait.observe(waited)
        return Admission(worker, waited, forced)

    def _place_at_arrival(self, program_id: str) -> str | None:
        """A new program's first request, placed at once by the policy's own arrival rule
        (maitred, ThunderAgent and MORI have one; the replay applies the same rule), instead of
        waiting for the step it would trigger. None: no rule, or it says wait."""
        rule = getattr(self.scheduler.policy, "admit_at_arrival", None)
        p = self.state.programs.get(program_id)
        if rule is None or p is None or p.home_worker is not None:
            return None
        try:
            decision = rule(self.state.view(self.clock(), lazy=True), program_id)
        except Exception:  # the step it falls back to degrades the same way (Scheduler.plan)
            log.exception("maitred: %s's arrival rule failed; %s waits for a step", self.scheduler.policy.name, program_id)
            return None
        if decision is None:
            return None
        self.state.apply_decision(decision)
        for a in decision.assignments:
            self.metrics.assignments.labels(a.reason).inc()
        home = self.state.programs[program_id].home_worker
        return home if home is not None and self.state.workers[home].healthy else None

    def held_count(self) -> int:
        return sum(len(w) for w in self._held.values())

    def _force(self, program_id: str) -> str:
        """Let a held request through: its healthy home, else the least loaded worker."""
        p = self.state.programs.get(program_id)
        home = p.home_worker if p is not None else None
        worker = home if home is not None and self.state.workers[home].healthy else self.least_loaded()
        self.state.force_admit(program_id, worker)
        self.metrics.forced.inc()
        self.kick()
        return worker

    def _release(self) -> None:
        for pid, waiters in list(self._held.items()):
            worker = self.state.admit_now(pid)
            if worker is None:
                continue
            for h in waiters:
                if not h.future.done():
                    h.future.set_result(worker)

    def _route_plainly(self) -> None:
        """After a failed step: every held request goes to its healthy home, else the least
        loaded worker (sticky, else least loaded)."""
        for pid, waiters in list(self._held.items()):
            try:
                worker = self._force(pid)
            except NoWorkerAvailable:
                return
            for h in waiters:
                if not h.future.done():
                    h.future.set_result(worker)

    def remember_prompt(self, program_id: str, prompt: str | list[int]) -> None:
        """The last text prompt of a program: what a warmup replays (chat prompts cannot be
        warmed: the chat template is applied inside the worker)."""
        self._prompts[program_id] = prompt

    def priority_for(self, program_id: str, worker: str) -> int | None:
        """SGLang request priority for ``--radix-eviction-policy priority``, or None when off.

        SGLang's ratchet: a cached prefix keeps the highest priority any request gave it, so a
        program once sent high cannot be demoted by sending it low. Priorities are therefore
        made to rise with time — the policy's priority within an epoch of ``priority_epoch_s``,
        every later epoch above every earlier one — and a program the policy demotes (it sends
        no requests while idle) is overtaken by the programs still running, instead of being
        lowered. ``ratchet`` records the effective value per (program, worker)."""
        if not self.cfg.priority:
            return None
        epoch = int((self.clock() - self.started_at) / self.cfg.priority_epoch_s)
        value = epoch * 1000 + self._priorities.get(program_id, 100)
        key = (program_id, worker)
        self.ratchet[key] = max(self.ratchet.get(key, value), value)
        return value

    def estimate_prompt(self, program_id: str, size: PromptSize | None) -> int | None:
        """Prompt tokens of a request before the worker counts them: what admission weighs it
        at. A program's own characters-per-token ratio is learned from its answers, so the
        estimate follows its tokenizer and content (code, prose, other languages)."""
        return None if size is None else size.estimate(self._chars_per_token.get(program_id))

    def completed(self, program_id: str, *, request_id: str, worker: str, prompt_tokens: int | None,
                  completion_tokens: int | None, cached_tokens: int | None, ttft_s: float | None,
                  ok: bool, store: bool = True, size: PromptSize | None = None) -> None:
        """A request finished: what the worker reported updates the program (its context, and
        what is now cached where) and goes to the store."""
        now = self.clock()
        if prompt_tokens is not None:
            self.metrics.prompt_tokens.inc(prompt_tokens)
        if cached_tokens is not None:
            self.metrics.cached_tokens.inc(cached_tokens)
        if ttft_s is not None:
            self.metrics.ttft.observe(ttft_s)
        p = self.state.programs.get(program_id)
        prompt = prompt_tokens if prompt_tokens is not None else (p.context_tokens if p is not None else 0)
        if ok and prompt_tokens is not None:
            self.last_usage[program_id] = (prompt_tokens, cached_tokens)
            if size is not None and size.tokens is None and size.chars and prompt_tokens:
                self._chars_per_token[program_id] = size.chars / prompt_tokens
        event = LLMEnd(ts=now, program_id=program_id, request_id=request_id, prompt_tokens=prompt,
                       completion_tokens=completion_tokens or 0, cached_tokens=cached_tokens,
                       worker=worker if ok else None, ttft_s=ttft_s, status="ok" if ok else "error")
        self.state.apply(event)
        if store and self.writer is not None:
            self.writer.submit([event])

    def end_anonymous(self, program_id: str) -> None:
        """A request without a program id is a one-step program: forget it once answered."""
        self._end(program_id, self.clock())

    def _end(self, program_id: str, now: float) -> None:
        self.state.apply(ProgramEnd(ts=now, program_id=program_id))
        self._forget(program_id)

    def _forget(self, program_id: str) -> None:
        self._prompts.pop(program_id, None)
        self._handoff_prompts.pop(program_id, None)
        self.last_usage.pop(program_id, None)
        self._chars_per_token.pop(program_id, None)
        for key in [k for k in self.ratchet if k[0] == program_id]:
            del self.ratchet[key]

    @staticmethod
    def new_request_id() -> str:
        return "gw-" + uuid.uuid4().hex

    # -- events ---------------------------------------------------------------------------------

    def ingest(self, events: list[Event]) -> None:
        """Events from the middleware or hooks: into the live state, then to the store."""
        for e in events:
            if isinstance(e, ToolEnd):
                self._observe_tool(e)
            elif isinstance(e, Handoff) and e.expected_prompt is not None:
                self._handoff_prompts[e.child_program_id or e.program_id] = e.expected_prompt
            self.state.apply(e)
            if isinstance(e, ProgramEnd):
                self._forget(e.program_id)
        self.metrics.events.inc(len(events))
        if self.writer is not None:
            self.writer.submit(events)
        self.kick()

    def _observe_tool(self, e: ToolEnd) -> None:
        tool = self.state.tool_for(e.program_id, e.call_id)
        if tool is None:
            return
        duration = e.duration_s if e.duration_s is not None else e.ts - tool.started
        name = tool.tool
        if name not in self._tool_labels:
            if len(self._tool_labels) >= MAX_TOOL_LABELS:
                name = "other"
            else:
                self._tool_labels.add(name)
        self.metrics.tool_duration.labels(name).observe(max(duration, 0.0))

    # -- the scheduler --------------------------------------------------------------------------

    def kick(self) -> None:
        """Ask for a scheduler step soon (coalesced with any already asked for)."""
        self._kick.set()

    async def _tick_loop(self) -> None:
        last = 0.0
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), self.cfg.tick_s)
            except TimeoutError:
                pass
            gap = self.cfg.min_gap_s - (time.monotonic() - last)
            if gap > 0:
                await asyncio.sleep(gap)
            self._kick.clear()
            last = time.monotonic()
            await self.step()

    def _plan(self, snapshot: Snapshot, now: float) -> tuple[View, Decision, dict[str, int], Tally]:
        """The part of a step that walks every program, in the scheduler thread."""
        view = snapshot.view(now)
        decision = self.scheduler.plan(view)
        return view, decision, free_after(decision, view), program_counts(snapshot.programs.values())

    async def step(self) -> Decision | None:
        """One scheduler step; never raises (a failure routes held requests plainly)."""
        started = time.perf_counter()
        try:
            snapshot = self.state.snapshot()
            view, decision, free, counts = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._plan, snapshot, self.clock())
            applied = self.scheduler.apply(decision, view, free)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.steps_failed += 1
            self.metrics.scheduler_errors.inc()
            log.exception("maitred: scheduler step failed; routing plainly")
            self._route_plainly()
            return None
        policy_failures = self.scheduler.failures - self._policy_failures_seen
        if policy_failures:
            self.metrics.scheduler_errors.inc(policy_failures)
            self._policy_failures_seen = self.scheduler.failures
        voided = self.scheduler.voided - self._voided_seen
        if voided:
            self.metrics.voided.inc(voided)
            self._voided_seen = self.scheduler.voided
        self.decision = applied
        self._priorities = applied.priorities
        for move in applied.tier_moves:
            if not move.lazy:
                self.metrics.tier_moves.labels(move.dst.value).inc()
        for a in applied.assignments:
            self.metrics.assignments.labels(a.reason).inc()
        self._release()
        pending = {h.program_id for h in pending_at(self.state.handoffs, self.clock())}
        for pid in self._handoff_prompts.keys() - pending:  # its consumer never came: expired
            del self._handoff_prompts[pid]
        if self.cfg.warmups:
            for warmup in applied.warmups:
                self._start_warmup(warmup)
        self.metrics.observe_state(self.state, counts)
        self.metrics.tick.observe(time.perf_counter() - started)
        return applied

    def _start_warmup(self, warmup: Warmup) -> None:
        """A handoff's consumer is warmed with the prompt the handoff said it will send
        (``expected_prompt``, LOCAL's API); without one there is nothing right to send, since
        the program's last prompt is the producer's. Other warmups replay the last prompt."""
        if warmup.kind == "handoff":
            prompt: str | list[int] | None = self._handoff_prompts.get(warmup.program_id)
        else:
            prompt = self._prompts.get(warmup.program_id)
        if prompt is None or warmup.program_id in self._warming or warmup.worker not in self.backends:
            self.metrics.warmups.labels("skipped").inc()
            return
        self._warming[warmup.program_id] = asyncio.create_task(self._warm(warmup, prompt))

    async def _warm(self, warmup: Warmup, prompt: str | list[int]) -> None:
        worker = self.state.workers[warmup.worker]
        worker.warmups_in_flight += 1
        outcome = "failed"
        try:
            await self.backends[warmup.worker].warmup(prompt, priority=self.priority_for(warmup.program_id, warmup.worker))
            outcome = "done"
            if warmup.kind == "handoff":
                self._handoff_prompts.pop(warmup.program_id, None)
            elif warmup.kind == "load_back" and self.state.programs.get(warmup.program_id) is not None:
                self.kick()
        except asyncio.CancelledError:
            outcome = "overtaken"
            raise
        except (httpx.HTTPError, WorkerProtocolError) as exc:
            log.info("maitred: warmup of %s on %s failed: %s", warmup.program_id, warmup.worker, exc)
        finally:
            worker.warmups_in_flight -= 1
            self.metrics.warmups.labels(outcome).inc()
            if self._warming.get(warmup.program_id) is asyncio.current_task():
                del self._warming[warmup.program_id]

    # -- introspection --------------------------------------------------------------------------

    def describe(self, program_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Programs as ``GET /v1/programs`` shows them (SPEC 7.5 fields, and a few more)."""
        now = self.clock()
        state = self.state
        ids = list(state.programs) if program_ids is None else [pid for pid in program_ids if pid in state.programs]
        out = []
        for pid in ids:
            p = state.programs[pid]
            signals = state.signals_of(p, now)
            last_prompt, last_cached = self.last_usage.get(pid, (None, None))
            out.append({
                "program_id": pid, "agent": p.agent, "phase": p.phase.value, "tier": p.tier.value,
                "worker": p.home_worker, "context_tokens": p.context_tokens,
                "idleness": round(signals.idleness, 4), "readiness": signals.readiness.r,
                "readiness_source": signals.readiness.source,
                "predicted_tool_end": signals.readiness.predicted_end,
                "tool": None if p.tool is None else {"call_id": p.tool.call_id, "tool": p.tool.tool,
                                                     "signature": p.tool.signature, "started": p.tool.started},
                "held": pid in self._held,
                "last_prompt_tokens": last_prompt, "last_cached_tokens": last_cached,
                "priority": None if p.home_worker is None else self.ratchet.get((pid, p.home_worker)),
                "cached": {k[0]: {"tokens": r.tokens, "observed_at": r.observed_at} for k, r in p.residency.items()},
                "gpu_tier": p.tier is Tier.GPU,
            })
        return out
