"""The live driver of the runtime core: requests, events and worker health on the wall clock.

``LiveDriver`` owns the ``RuntimeState`` and its ``RuntimeCore`` and mutates them only on the
asyncio event loop, so no lock is needed. Every rule — admission at arrival, holding and
forced admission, priorities, which warmups to send, the plan re-check — is the core's
(``maitred/runtime/core.py``), which the replay drives the same way in virtual time; this module
only keeps time, holds the requests (futures), talks to the workers and counts metrics. Parts
of it live beside it, as mixins of ``LiveDriver``: restoring a previous run at start
(``restore``), polling the workers (``worker_poll``), sending warmups (``warmups``) and the
programs as ``GET /v1/programs`` shows them (``program_view``); re-sent events are recognised
by ``recent_keys``.

A scheduler step runs on the policy's cadence (``Cadence.period_s``) and, for policies that
have one, ``urgent_s`` after a request is held or a handoff arrives. The state is snapshotted on
the loop (copy-on-write: cheap), the policy runs on the snapshot in a worker thread so a
10,000-program step never stalls requests, and the core applies what still holds. A failed step
is logged and counted, and held requests are routed plainly — sticky to a healthy home, else
to the least loaded worker — so a scheduler bug never costs a request.
"""

import asyncio
import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from maitred.events import Event, Handoff, LLMEnd, ProgramEnd, ToolEnd
from maitred.gateway.backend import WorkerBackend
from maitred.gateway.health import WorkerWatch
from maitred.gateway.live_config import LiveConfig
from maitred.gateway.metrics import Metrics, Tally, program_counts
from maitred.gateway.program_view import ProgramView
from maitred.gateway.prompt_keep import PromptKeep
from maitred.gateway.recent_keys import RecentKeys
from maitred.gateway.restore import GATEWAY_REQUEST_PREFIX, RestoreAtStart
from maitred.gateway.store_writer import StoreWriter
from maitred.gateway.usage import PromptSize
from maitred.gateway.warmups import WarmupSender
from maitred.gateway.worker_poll import NoWorkerAvailable, WorkerPolling
from maitred.runtime.claims import believable, clamp_tokens, token_limit
from maitred.runtime.core import CoreConfig, Plan, RuntimeCore, StepResult
from maitred.runtime.decisions import Decision
from maitred.runtime.records import SignalConfig, WorkerState
from maitred.runtime.state import RuntimeState, Snapshot

if TYPE_CHECKING:
    from maitred.gateway.shard_link import ShardLink
    from maitred.middleware.emitter import Emitter

log = logging.getLogger("maitred.service")


@dataclass(slots=True)
class Admission:
    worker: str
    waited_s: float
    forced: bool = False


#: What a balancer's request id (``X-Maitred-Request-Id``) may be.
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
#: Under ``--shard``, how long an answer waits for its history to reach the store
#: (``LiveDriver.stored``).
STORED_WAIT_S = 10.0


@dataclass(slots=True)
class _Held:
    future: "asyncio.Future[str]"
    since: float


@dataclass
class LiveDriver(RestoreAtStart, WorkerPolling, WarmupSender, ProgramView):
    #: the workers by id (an SGLang server's URL, a Dynamo instance id); ``add_worker`` adds one
    backends: MutableMapping[str, WorkerBackend]
    cfg: LiveConfig = field(default_factory=LiveConfig)
    metrics: Metrics = field(default_factory=Metrics)
    writer: StoreWriter | None = None
    #: Under ``--shard``: answers wait for their history to reach the store (``stored``).
    answer_when_stored: bool = False
    #: ``maitred serve --otlp-endpoint``: what goes to the store is also exported, from this
    #: emitter's thread (``emit`` only appends to its queue).
    exporter: "Emitter | None" = None
    #: The export's ``OtlpSink.note``: called with each start event it is about to get, right
    #: after the runtime observed it, so its span carries the live signals (``span_signals``).
    note_span: Callable[[Event], None] | None = None
    clock: Callable[[], float] = time.time
    #: ``maitred serve --shard``: where this shard claims the programs it sees (``shard_link``)
    homes: "ShardLink | None" = None

    def __post_init__(self) -> None:
        self.state = RuntimeState(
            [], SignalConfig(busy_margin=self.cfg.busy_margin, overcommit_headroom=self.cfg.overcommit_headroom)
        )
        for url in self.backends:
            self.state.add_worker(WorkerState(url, gpu_tokens=0, healthy=False))
        self.started_at = self.clock()
        self.core = RuntimeCore(
            self.state,
            self.cfg.policy,
            CoreConfig(
                period_s=self.cfg.tick_s,
                hold_s=self.cfg.hold_timeout_s,
                priorities=self.cfg.priority,
                priority_epoch_s=self.cfg.priority_epoch_s,
                warmups=self.cfg.warmups,
                journal=self.cfg.journal,
            ),
            started_at=self.started_at,
        )
        self.state.cfg = replace(self.state.cfg, period_s=self.core.cadence.period_s)
        self.scheduler = self.core.scheduler
        self.decision: Decision | None = None
        self.inflight: Counter[str] = Counter()
        self.steps_failed = 0
        self._held: dict[str, list[_Held]] = {}
        self.watch = WorkerWatch(
            self.backends,
            self.state,
            self.metrics,
            fail_after=self.cfg.fail_after,
            policy=self.cfg.policy,
            on_change=self.kick,
            fresh_s=self.cfg.poll_s,
        )
        self.warm_prompts = PromptKeep(self.cfg.prompts)  # program -> its last prompt (for warmups), bounded
        self._handoff_prompts: dict[str, str] = {}  # consumer program -> a handoff's expected_prompt
        self.last_usage: dict[str, tuple[int, int | None]] = {}  # program -> (prompt, cached) tokens of its last answer
        self._chars_per_token: dict[str, float] = {}  # program -> learned from its answers (admission estimates)
        self._warming: dict[str, asyncio.Task[None]] = {}
        self._kick = asyncio.Event()
        self._urgent_at: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="maitred-scheduler")
        self._policy_failures_seen = 0
        self._voided_seen = 0
        self._stopping = False
        self.recent = RecentKeys(self.cfg.recent_event_keys)
        self.shutting_down = False  # the gateway refuses new model requests (graceful shutdown)

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, *, wait_for_workers_s: float = 0.0) -> None:
        """Read each worker's capacity (a worker that does not answer starts as down and is
        polled), then start the scheduler and polling tasks."""
        deadline = time.monotonic() + wait_for_workers_s
        while True:
            await self.watch.check_all()
            # (no workers at all, a telemetry-only gateway, has nothing to wait for)
            ready = not self.state.workers or any(w.healthy for w in self.state.workers.values())
            if ready or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        self._tasks = [asyncio.create_task(self._tick_loop()), asyncio.create_task(self._poll_loop())]

    def add_worker(self, worker_id: str, backend: WorkerBackend) -> None:
        """A worker that appeared after start (Dynamo's discovery): it starts as down, is polled
        like the others, and takes programs once its capacity is read."""
        if worker_id in self.backends:
            return
        self.backends[worker_id] = backend
        self.state.add_worker(WorkerState(worker_id, gpu_tokens=0, healthy=False))
        self.watch.add(worker_id)

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

    # -- requests -------------------------------------------------------------------------------

    async def admit(
        self,
        program_id: str,
        *,
        request_id: str,
        agent: str | None,
        model: str | None,
        prompt_tokens: int | None,
        store: bool = True,
        trace_id: str | None = None,
    ) -> Admission:
        """Wait until ``program_id`` may run, and say where; its ``llm.start`` is stored with the
        caller's ``trace_id``. A request refused because no worker is healthy leaves nothing
        behind of a program it created."""
        now = self.clock()
        known = program_id in self.state.programs
        prompt_tokens = clamp_tokens(prompt_tokens, token_limit(self.state.workers.values()))  # (``claims``)
        arrival = self.core.arrive(program_id, now, agent=agent, model=model, prompt_tokens=prompt_tokens, request_id=request_id)
        worker = arrival.worker
        if store:
            event = arrival.event if trace_id is None else replace(arrival.event, trace_id=trace_id)
            self._note(event)
            self._record([event])
            if not known:
                self._claim(program_id)
        self._handoff_prompts.pop(program_id, None)  # the consumer asked: its warmup is moot
        warming = self._warming.pop(program_id, None)
        if warming is not None:  # overtaken by the real request: the warmup is moot
            warming.cancel()
        if arrival.decision is not None:
            for a in arrival.decision.assignments:
                self.metrics.assignments.labels(a.reason).inc()
        if worker is not None:
            self.metrics.queue_wait.observe(0.0)
            return Admission(worker, 0.0)
        if not any(w.healthy for w in self.state.workers.values()):
            self._refused(program_id, request_id, known=known, store=store)
            raise self.no_worker()
        held = _Held(asyncio.get_running_loop().create_future(), time.monotonic())
        self.metrics.held.inc()
        self._held.setdefault(program_id, []).append(held)
        self.kick_soon()
        forced = sent = False
        try:
            timeout = max(self.core.hold_deadline(program_id) - self.clock(), 0.0)
            try:
                worker = await asyncio.wait_for(asyncio.shield(held.future), timeout)
            except TimeoutError:
                worker, forced = self._force(program_id), True
            sent = True
        finally:
            waiters = self._held.get(program_id)
            if waiters is not None:
                waiters.remove(held)
                if not waiters:
                    del self._held[program_id]
                    self.core.unhold(program_id)
                    if not sent:  # its client gave up, or no worker is left: the program wants the GPU no more
                        self._refused(program_id, request_id, known=True, store=store)
        waited = time.monotonic() - held.since
        self.metrics.queue_wait.observe(waited)
        return Admission(worker, waited, forced)

    def _refused(self, program_id: str, request_id: str, *, known: bool, store: bool) -> None:
        """A request that will not be sent: a program it created is forgotten whole; a known one
        stops wanting the GPU (its ``llm.end``, status ``cancelled``, is stored), so it neither
        blocks other programs' admission nor gets placed for a request that is gone."""
        if not known:
            self.core.discard(program_id)
            self._forget(program_id)
            return
        event = self.core.abandon(program_id, self.clock(), request_id=request_id)
        if event is not None and store:
            self._record([event])

    def cut_short(self, program_id: str, request_id: str, *, anonymous: bool) -> None:
        """A request ended by the gateway's shutdown before its answer: its step ends
        (``llm.end``, cancelled, stored unless the request named no program, which is then
        forgotten like any one-step program)."""
        self._refused(program_id, request_id, known=True, store=not anonymous)
        if anonymous:
            self.end_anonymous(program_id)

    def held_count(self) -> int:
        return sum(len(w) for w in self._held.values())

    def _force(self, program_id: str) -> str:
        """Let a held request through after its bounded wait (the core's rule)."""
        worker = self.core.force(program_id, self.clock(), load=self.inflight)
        if worker is None:
            raise self.no_worker()
        self.metrics.forced.inc()
        return worker

    def _resolve(self, released: Mapping[str, str]) -> None:
        for pid, worker in released.items():
            for h in self._held.get(pid, ()):
                if not h.future.done():
                    h.future.set_result(worker)

    def priority_for(self, program_id: str, worker: str) -> int | None:
        """SGLang request priority for ``--radix-eviction-policy priority``, or None when off (the core's encoding)."""
        return self.core.priority_for(program_id, worker, self.clock())

    def chars_per_token(self, program_id: str) -> float | None:
        """``program_id``'s characters per token, learned from its answers (None until one came)."""
        return self._chars_per_token.get(program_id)

    def estimate_prompt(self, program_id: str, size: PromptSize | None) -> int | None:
        """Prompt tokens of a request before the worker counts them: what admission weighs it
        at. A program's own characters-per-token ratio is learned from its answers, so the
        estimate follows its tokenizer and content (code, prose, other languages)."""
        return None if size is None else size.estimate(self.chars_per_token(program_id))

    def completed(
        self,
        program_id: str,
        *,
        request_id: str,
        worker: str,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cached_tokens: int | None,
        ttft_s: float | None,
        ok: bool,
        store: bool = True,
        size: PromptSize | None = None,
        trace_id: str | None = None,
    ) -> None:
        """A request finished: what the worker reported updates the program (its context, and
        what is now cached where) and goes to the store."""
        now = self.clock()
        if prompt_tokens is not None:
            self.metrics.prompt_tokens.inc(prompt_tokens)
        if cached_tokens is not None:
            self.metrics.cached_tokens.inc(cached_tokens)
        p = self.state.programs.get(program_id)
        prompt = prompt_tokens if prompt_tokens is not None else (p.context_tokens if p is not None else 0)
        if ok:
            self.watch.answered(worker)
        if ok and prompt_tokens is not None:
            self.last_usage[program_id] = (prompt_tokens, cached_tokens)
            if size is not None and size.tokens is None and size.chars and prompt_tokens:
                self._chars_per_token[program_id] = size.chars / prompt_tokens
        event = LLMEnd(
            ts=now,
            program_id=program_id,
            request_id=request_id,
            prompt_tokens=prompt,
            completion_tokens=completion_tokens or 0,
            cached_tokens=cached_tokens,
            worker=worker if ok else None,
            ttft_s=ttft_s,
            status="ok" if ok else "error",
            trace_id=trace_id,
        )
        self.core.observe(event)
        if store:
            self._record([event])

    async def stored(self, timeout_s: float = STORED_WAIT_S) -> bool:
        """Under ``--shard`` (``answer_when_stored``), wait until every event recorded so far is
        in the store: the standby that takes over after a crash restores from there, so what the
        holder answered for must be in it. True at once otherwise; False when not written
        within ``timeout_s``, or never to be."""
        writer = self.writer
        if not self.answer_when_stored or writer is None:
            return True
        try:
            return await asyncio.wait_for(writer.when_written(writer.mark()), timeout_s)
        except TimeoutError:
            return False

    def _record(self, events: list[Event]) -> None:
        """Events for history: the store writer, and the OTLP export beside it; neither waits."""
        if self.writer is not None:
            self.writer.submit(events)
        if self.exporter is not None:
            for event in events:
                self.exporter.emit(event)

    def _note(self, event: Event) -> None:
        """The live signals for ``event``'s span, read now: before the next event changes them."""
        if self.note_span is not None:
            self.note_span(event)

    def end_anonymous(self, program_id: str) -> None:
        """A request without a program id is a one-step program: forget it once answered."""
        self._end(program_id, self.clock())

    def _end(self, program_id: str, now: float) -> None:
        self.core.end(program_id, now)
        self._forget(program_id)

    def drop(self, program_id: str, now: float) -> bool:
        """Stop serving a program that goes on (silent past ``program_ttl_s``, or moved to
        another shard): the core forgets it (``RuntimeCore.drop``), and so does the driver;
        requests of it still held go now, as after a late ``program.end``. False when it was
        not live here."""
        if not self.core.drop(program_id, now):
            return False
        self._forget(program_id)
        self._let_through(program_id)
        return True

    def moved_away(self, program_id: str) -> None:
        """Another shard claimed ``program_id`` (``shard_link``): its room here is freed now,
        not after its TTL. Its history stays in the store; nothing is stored for the move."""
        if self.drop(program_id, self.clock()):
            self.metrics.moved_away.inc()
            log.debug("maitred: %s moved to another shard; dropped here", program_id)

    def _claim(self, program_id: str) -> None:
        """This gateway saw ``program_id`` first: under ``--shard`` it becomes the program's home."""
        if self.homes is not None:
            self.homes.claim(program_id)

    def _forget(self, program_id: str) -> None:
        self.warm_prompts.pop(program_id)
        self._handoff_prompts.pop(program_id, None)
        self.last_usage.pop(program_id, None)
        self._chars_per_token.pop(program_id, None)

    @staticmethod
    def new_request_id(given: str | None = None) -> str:
        """The id of a model request in the program's history. ``given``: the balancer's id of
        the client's request (``X-Maitred-Request-Id``, the same on each of its retries), so a
        request retried after its gateway died is one model call in the store, not two."""
        if given is None:
            return GATEWAY_REQUEST_PREFIX + uuid.uuid4().hex
        if not REQUEST_ID_RE.fullmatch(given):
            raise ValueError(f"expected 1 to 128 letters, digits, '.', '_', ':' or '-', got {given[:140]!r}")
        return GATEWAY_REQUEST_PREFIX + given

    # -- events ---------------------------------------------------------------------------------

    def ingest(self, events: list[Event]) -> int:
        """Events from the middleware or hooks: into the live state, as far as they can be true
        (``runtime.claims``: not from the future, no more tokens than a worker holds), then to
        the store as they were sent. An event seen among the recent ones (``RecentKeys``) is
        skipped: the store would not store it again, and the live state must not count it again
        either (tool statistics feed readiness). Returns how many were skipped so."""
        given = len(events)
        events = self.recent.fresh(events)
        duplicates = given - len(events)
        if duplicates:
            self.metrics.duplicate_events.inc(duplicates)
        handoff = False
        now, limit = self.clock(), token_limit(self.state.workers.values())
        for sent in events:
            e = believable(sent, now=now, limit=limit)
            if isinstance(e, ToolEnd):
                self._observe_tool(e)
            elif isinstance(e, Handoff):
                handoff = True
                if e.expected_prompt is not None:
                    self._handoff_prompts[e.child_program_id or e.program_id] = e.expected_prompt
            new = e.program_id not in self.state.programs
            self.core.observe(e)
            if new and e.program_id in self.state.programs:
                self._claim(e.program_id)
            self._note(sent)
            if isinstance(e, ProgramEnd):
                self._forget(e.program_id)
                self._let_through(e.program_id)
        self.metrics.events.inc(len(events))
        self._record(events)
        if handoff:
            self.kick_soon()
        return duplicates

    def _let_through(self, program_id: str) -> None:
        """A program that ended while a request of it was held (a late ``program.end`` racing its
        next request): no step will admit a program the state no longer has, so its requests
        go now, to the least loaded worker, instead of waiting out the hold bound."""
        if program_id not in self._held:
            return
        try:
            self._resolve({program_id: self._force(program_id)})
        except NoWorkerAvailable:
            pass  # they wait for a worker, and are let through when their bound is reached

    def _observe_tool(self, e: ToolEnd) -> None:
        tool = self.state.tool_for(e.program_id, e.call_id)
        if tool is None:
            return
        duration = e.duration_s if e.duration_s is not None else e.ts - tool.started
        self.metrics.observe_tool(tool.tool, duration)

    # -- the scheduler --------------------------------------------------------------------------

    def kick(self) -> None:
        """Ask for a scheduler step now (coalesced with any already asked for): a worker changed."""
        self._kick.set()

    def kick_soon(self) -> None:
        """A step ``urgent_s`` after a request is held or a handoff arrives, for policies that
        have one (``Cadence``; the replay asks for the same); the others wait for their period."""
        urgent = self.core.cadence.urgent_s
        if urgent is None:
            return
        if urgent <= 0:
            self.kick()
        elif self._urgent_at is None:
            self._urgent_at = self.clock() + urgent
            asyncio.get_running_loop().call_later(urgent, self._urgent)

    def _urgent(self) -> None:
        self._urgent_at = None
        self.kick()

    async def _tick_loop(self) -> None:
        last = 0.0
        while True:
            try:
                await asyncio.wait_for(self._kick.wait(), self.core.cadence.period_s)
            except TimeoutError:
                pass
            gap = self.cfg.min_gap_s - (time.monotonic() - last)
            if gap > 0:
                await asyncio.sleep(gap)
            self._kick.clear()
            last = time.monotonic()
            await self.step()

    def _plan(self, snapshot: Snapshot, now: float) -> tuple[Plan, Tally]:
        """The part of a step that walks every program, in the scheduler thread."""
        return self.core.plan(snapshot, now), program_counts(snapshot.programs.values())

    async def step(self) -> Decision | None:
        """One scheduler step; never raises (a failure routes held requests plainly)."""
        started = time.perf_counter()
        try:
            await self.watch.refresh_loads()
            snapshot = self.state.snapshot()
            plan, counts = await asyncio.get_running_loop().run_in_executor(self._executor, self._plan, snapshot, self.clock())
            result = self.core.apply(plan, self.clock())
        except asyncio.CancelledError:
            raise
        except Exception:
            self.steps_failed += 1
            self.metrics.scheduler_errors.inc()
            log.exception("maitred: scheduler step failed; routing plainly")
            self._resolve(self.core.route_plainly(self.clock(), load=self.inflight))
            return None
        self._after_step(result)
        self.metrics.observe_state(self.state, counts)
        self.metrics.tick.observe(time.perf_counter() - started)
        return result.decision

    def _after_step(self, result: StepResult) -> None:
        policy_failures = self.scheduler.failures - self._policy_failures_seen
        if policy_failures:
            self.metrics.scheduler_errors.inc(policy_failures)
            self._policy_failures_seen = self.scheduler.failures
        voided = self.scheduler.voided - self._voided_seen
        if voided:
            self.metrics.voided.inc(voided)
            self._voided_seen = self.scheduler.voided
        self.decision = result.decision
        for move in result.decision.tier_moves:
            if not move.lazy:
                self.metrics.tier_moves.labels(move.dst.value).inc()
        for a in result.decision.assignments:
            self.metrics.assignments.labels(a.reason).inc()
        self._resolve(result.released)
        for pid in self._handoff_prompts.keys() - self.core.prompts.handoff:  # its consumer never came: expired
            del self._handoff_prompts[pid]
        for warmup in result.warmups:
            self._start_warmup(warmup)
