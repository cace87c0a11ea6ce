"""``RuntimeCore``: everything between an event and a decision, for both drivers.

The gateway (``maitred/gateway/loop.py``) drives it on the wall clock and the replay
(``maitred/sim/replay.py``) in virtual time; neither re-implements a rule, so what the replay
measures is what ``maitred serve`` runs. The rules it owns:

- **Admission at arrival.** A request of a program in the GPU tier of a healthy home goes at
  once (unless the last step withheld it: ThunderAgent's marked programs); otherwise the
  policy's own arrival rule (``Policy.admit_at_arrival``, O(workers): it reads the state's
  totals, never every program) may let it in; otherwise it is held.
- **Holding and forced admission.** A held request waits for a step that admits its program,
  or for the policy's hold bound (``Cadence.hold_s``), after which it is let through to its
  healthy home, else to the least loaded worker, and the state records it there.
- **Steps.** Plan on a snapshot (may run in another thread), then apply what still holds in the
  live state (TAO's plan re-check, ``Scheduler.apply``) and release the held programs now
  admitted.
- **Priorities** under SGLang's ratchet (``admission.encode_priority``).
- **Warmups** that can be sent (``Prompts``, read by the policy's warmup admission): a
  handoff's consumer only where the driver holds the prompt it will send, any other program
  only where the driver holds its last prompt, one at a time per program; a warmup overtaken
  by the real request is moot.

Plain data and ``now`` in, decisions out: no I/O, no clock, no threads.
"""

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from maitred.events import Event, Handoff, LLMEnd, LLMStart, ProgramEnd
from maitred.runtime.admission import Cadence, encode_priority
from maitred.runtime.decisions import Decision, Warmup
from maitred.runtime.policies import Policy
from maitred.runtime.records import Phase, Tier
from maitred.runtime.scheduler import Scheduler, free_after
from maitred.runtime.state import RuntimeState, Snapshot, View, pending_at

log = logging.getLogger("maitred.runtime")

#: Decisions the journal keeps (oldest dropped first): enough for a parity run or a debugging
#: session, bounded for a gateway left running with it on.
JOURNAL_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """What a driver may override of the policy's cadence, and the optional behaviours."""

    period_s: float | None = None  # None: the policy's
    hold_s: float | None = None  # None: the policy's
    priorities: bool = True  # encode SGLang request priorities (--radix-eviction-policy priority)
    priority_epoch_s: float = 10.0
    warmups: bool = True
    journal: bool = False  # record every admission, placement and tier move

    def cadence(self, policy: Cadence) -> Cadence:
        return Cadence(
            period_s=self.period_s if self.period_s is not None else policy.period_s,
            hold_s=self.hold_s if self.hold_s is not None else policy.hold_s,
            urgent_s=policy.urgent_s,
        )


@dataclass(frozen=True, slots=True)
class Entry:
    """One decision as it took effect: ``kind`` is admit, force, assign, move (``detail``: the
    destination tier) or lazy (a demotion that waits for the running step)."""

    t: float
    kind: str
    program_id: str
    worker: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Arrival:
    """What ``RuntimeCore.arrive`` decided: the event to store, the worker the request may go to
    now (None: it is held), and the arrival rule's decision when one was made."""

    event: LLMStart
    worker: str | None
    decision: Decision | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    view: View
    decision: Decision
    free: dict[str, int]


@dataclass(frozen=True, slots=True)
class StepResult:
    decision: Decision
    #: held programs the step admitted, with their worker
    released: dict[str, str] = field(default_factory=dict)
    #: warmups the driver should send now
    warmups: tuple[Warmup, ...] = ()


class RuntimeCore:
    def __init__(
        self, state: RuntimeState, policy: Policy | str = "maitred", cfg: CoreConfig | None = None, *, started_at: float = 0.0
    ) -> None:
        self.state = state
        self.cfg = cfg or CoreConfig()
        self.scheduler = Scheduler(state, policy)
        self.policy = self.scheduler.policy
        self.cadence = self.cfg.cadence(self.policy.cadence)
        #: whether a driver should keep prompts for warmups: they are on and the policy proposes some
        self.warms = self.cfg.warmups and self.policy.warms
        self.started_at = started_at
        #: program -> when its oldest held request arrived
        self.held: dict[str, float] = {}
        self.withheld: frozenset[str] = frozenset()
        self.priorities: Mapping[str, int] = {}
        self.ratchet: dict[str, dict[str, int]] = {}  # program -> worker -> highest priority sent
        self.journal: deque[Entry] = deque(maxlen=JOURNAL_LIMIT)
        self.forced = 0
        self.prompts = state.prompts  # which warmups the driver can send (the policy reads it in its view)

    # -- requests -------------------------------------------------------------------------------

    def arrive(
        self,
        program_id: str,
        now: float,
        *,
        agent: str | None = None,
        model: str | None = None,
        prompt_tokens: int | None = None,
        request_id: str = "gateway",
    ) -> Arrival:
        """A model request of ``program_id`` arrived: admit it now, or hold it."""
        event = LLMStart(
            ts=now, program_id=program_id, agent=agent, request_id=request_id, model=model, prompt_tokens=prompt_tokens
        )
        self.state.apply(event)
        self.prompts.handoff.discard(program_id)  # the consumer asked: its warmup is moot
        worker, decision = self.admissible(program_id), None
        if worker is None:
            decision = self._arrival_rule(program_id, now)
            worker = self.admissible(program_id) if decision is not None else None
        if worker is None:
            self.held.setdefault(program_id, now)
        else:
            self._record(now, "admit", program_id, worker)
        return Arrival(event, worker, decision)

    def admissible(self, program_id: str) -> str | None:
        """The worker a request of ``program_id`` may go to without a decision: its healthy home,
        when the program is in that home's GPU tier and the last step did not withhold it."""
        p = self.state.programs.get(program_id)
        if p is None or p.home_worker is None or p.tier is not Tier.GPU or program_id in self.withheld:
            return None
        worker = self.state.workers.get(p.home_worker)
        return p.home_worker if worker is not None and worker.healthy else None

    def _arrival_rule(self, program_id: str, now: float) -> Decision | None:
        try:
            decision = self.policy.admit_at_arrival(self.state.view(now, lazy=True), program_id)
        except Exception:  # the step it falls back to degrades the same way (Scheduler.plan)
            log.exception("maitred: %s's arrival rule failed; %s waits for a step", self.policy.name, program_id)
            return None
        if decision is not None:
            self.state.apply_decision(decision)
            self._record_decision(now, decision)
        return decision

    def hold_deadline(self, program_id: str) -> float:
        """When a held request of ``program_id`` is let through anyway."""
        return self.held.get(program_id, 0.0) + self.cadence.hold_s

    def force(self, program_id: str, now: float, *, load: Mapping[str, int] | None = None) -> str | None:
        """Let a held request through after its bounded wait (no request waits forever): to its
        healthy home, else the least loaded worker (None: no worker is healthy). The state
        records that the program now occupies that GPU, so the next step makes room for it on
        purpose instead of leaving the engine to evict blindly."""
        p = self.state.programs.get(program_id)
        home = p.home_worker if p is not None else None
        worker = home if home is not None and self.state.workers[home].healthy else self.least_loaded(load)
        self.held.pop(program_id, None)
        if worker is None:
            return None
        self.state.force_admit(program_id, worker)
        self.forced += 1
        self._record(now, "force", program_id, worker)
        return worker

    def least_loaded(self, load: Mapping[str, int] | None = None) -> str | None:
        """The healthy worker with the fewest requests (``load``: the driver's count in flight,
        else the engine's queue), then the least GPU-tier use."""
        used = self.state.gpu_used()
        healthy = [w for w, s in self.state.workers.items() if s.healthy]
        if not healthy:
            return None
        return min(healthy, key=lambda w: ((load or {}).get(w, 0), self.state.workers[w].queued_requests, used[w], w))

    def abandon(self, program_id: str, now: float, *, request_id: str = "gateway") -> LLMEnd | None:
        """A request of ``program_id`` will not be sent (its client left, or no worker is left):
        its step ends, cancelled, so the program stops wanting the GPU. The event to store, or
        None when the program is not mid-step."""
        self.held.pop(program_id, None)
        p = self.state.programs.get(program_id)
        if p is None or p.phase is not Phase.REASONING:
            return None
        event = LLMEnd(
            ts=max(now, p.phase_since),
            program_id=program_id,
            request_id=request_id,
            prompt_tokens=p.context_tokens,
            completion_tokens=0,
            status="cancelled",
        )
        self.state.apply(event)
        return event

    def unhold(self, program_id: str) -> None:
        """The program's held requests left the hold (released, forced, or their client gave up)."""
        self.held.pop(program_id, None)

    # -- steps ----------------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self.state.snapshot()

    def plan(self, snapshot: Snapshot, now: float) -> Plan:
        """The part of a step that walks every program; touches no live state (another thread may run it)."""
        view = snapshot.view(now)
        decision = self.scheduler.plan(view)
        return Plan(view, decision, free_after(decision, view))

    def apply(self, plan: Plan, now: float) -> StepResult:
        """Apply what still holds of ``plan`` in the live state; release the held programs it admits."""
        applied = self.scheduler.apply(plan.decision, plan.view, plan.free)
        self.withheld = applied.withheld
        self.priorities = applied.priorities
        self._record_decision(now, applied)
        released = {}
        for pid in list(self.held):
            worker = self.admissible(pid)
            if worker is not None:
                del self.held[pid]
                released[pid] = worker
                self._record(now, "admit", pid, worker)
        pending = {h.program_id for h in pending_at(self.state.handoffs, now)}
        self.prompts.handoff &= pending  # a consumer that never came: its prompt is stale
        return StepResult(applied, released, applied.warmups if self.cfg.warmups else ())

    def step(self, now: float) -> StepResult:
        """Plan and apply in one thread (the replay): the same path as the gateway's split step."""
        return self.apply(self.plan(self.snapshot(), now), now)

    def route_plainly(self, now: float, *, load: Mapping[str, int] | None = None) -> dict[str, str]:
        """After a failed step: every held program goes to its healthy home, else the least
        loaded worker, so a scheduler bug never costs a request."""
        out = {}
        for pid in list(self.held):
            worker = self.force(pid, now, load=load)
            if worker is None:
                break
            out[pid] = worker
        return out

    # -- priorities and warmups -----------------------------------------------------------------

    def priority_for(self, program_id: str, worker: str, now: float) -> int | None:
        """The priority to send with a request of ``program_id`` to ``worker`` (None when off);
        ``ratchet`` records the highest sent per (program, worker), as SGLang keeps it."""
        if not self.cfg.priorities:
            return None
        value = encode_priority(self.priorities.get(program_id, 100), now, self.started_at, self.cfg.priority_epoch_s)
        sent = self.ratchet.setdefault(program_id, {})
        sent[worker] = max(sent.get(worker, value), value)
        return value

    def prompt_seen(self, program_id: str) -> None:
        """The driver holds ``program_id``'s last prompt (text, token ids or chat messages it can render)."""
        self.prompts.last.add(program_id)

    def prompt_dropped(self, program_id: str) -> None:
        """The driver no longer holds ``program_id``'s last prompt (refused, or evicted for room)."""
        self.prompts.last.discard(program_id)

    def handoff_prompt_seen(self, program_id: str) -> None:
        """The driver holds the prompt a handoff's consumer ``program_id`` will send."""
        self.prompts.handoff.add(program_id)

    def warming(self, program_id: str, busy: bool) -> None:
        """A warmup of ``program_id`` started (``busy``) or ended."""
        if busy:
            self.prompts.warming.add(program_id)
        else:
            self.prompts.warming.discard(program_id)

    def handoff_warmed(self, program_id: str) -> None:
        """A handoff's warmup was sent: its prompt is spent (each handoff is warmed once)."""
        self.prompts.handoff.discard(program_id)

    # -- events ---------------------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """An event from the instrumentation, a hook or the worker's answer."""
        self.state.apply(event)
        if isinstance(event, Handoff) and event.expected_prompt is not None:
            self.handoff_prompt_seen(event.child_program_id or event.program_id)
        elif isinstance(event, ProgramEnd):
            self._forget(event.program_id)

    def end(self, program_id: str, now: float) -> None:
        self.observe(ProgramEnd(ts=now, program_id=program_id))

    def drop(self, program_id: str, now: float) -> bool:
        """This gateway stops serving ``program_id`` though the program goes on (silent past its
        TTL, or moved to another shard): forgotten as its end forgets it, its GPU-tier room,
        held requests, prompts and priorities with it, and events stamped up to ``now`` cannot
        bring it back. Nothing is stored: the program did not end. False when it was not live."""
        if program_id not in self.state.programs:
            return False
        self.end(program_id, now)
        return True

    def discard(self, program_id: str) -> None:
        """Forget a program created by a request that was then refused: nothing of it stays."""
        self.state.discard(program_id)
        self._forget(program_id)

    def _forget(self, program_id: str) -> None:
        self.held.pop(program_id, None)
        self.prompts.forget(program_id)
        self.ratchet.pop(program_id, None)

    # -- journal --------------------------------------------------------------------------------

    def _record_decision(self, now: float, decision: Decision) -> None:
        if not self.cfg.journal:
            return
        for m in decision.tier_moves:
            self._record(now, "lazy" if m.lazy else "move", m.program_id, m.worker, m.dst.value)
        for a in decision.assignments:
            self._record(now, "assign", a.program_id, a.worker, a.reason)

    def _record(self, now: float, kind: str, program_id: str, worker: str, detail: str = "") -> None:
        if self.cfg.journal:
            self.journal.append(Entry(now, kind, program_id, worker, detail))
