"""``RuntimeState``: the live picture of programs and workers, updated from events.

A small state machine: ``apply(event)`` moves a program between phases and records what the
signals need (phase time for idleness, the open tool call for readiness, residency for cache
credit, pending handoffs for pre-prefill); ``apply_decision`` records what the scheduler did
(tiers, homes). ``view(now)`` hands the policies a read-only snapshot with the signals computed
once. Time comes from the events and from ``now`` arguments, never from a clock.

``snapshot()`` hands out a private copy instead, for a policy step that runs in another thread
while the live state keeps changing (the gateway). It is kept cheap by copy-on-write: every
program touched since the previous snapshot is copied once, the others are shared with it (a
copy is never mutated after it is made), so a snapshot of 10,000 programs of which a handful
changed costs a handful of copies and one dict copy.
"""

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType
from typing import Any

from maitred.events import (
    BACKGROUND_WAIT,
    AdapterPublish,
    Event,
    Handoff,
    LLMEnd,
    LLMStart,
    ProgramEnd,
    ProgramResume,
    ProgramStart,
    ProgramWait,
    ToolEnd,
    ToolProgress,
    ToolStart,
)
from maitred.runtime.decisions import Decision
from maitred.runtime.history import DurationStats, PredictionLog, StatsRow, ToolHistory
from maitred.runtime.idleness_table import IdlenessInputs, IdlenessTable
from maitred.runtime.records import (
    OpenTool,
    PendingHandoff,
    Phase,
    ProgramState,
    Prompts,
    Residency,
    SignalConfig,
    Tier,
    WorkerState,
)
from maitred.runtime.signals import Readiness, idleness, predict_end, readiness
from maitred.runtime.totals import Totals, TotalsKeeper

#: A handoff's messages are counted at roughly this many characters per token when no count is given.
CHARS_PER_TOKEN = 4
HANDOFF_TTL_S = 120.0
#: Tool calls whose end had not been seen when the program's next step began, kept so that a
#: late ``tool.end`` still counts in the history (oldest forgotten first past this many).
MAX_LATE_TOOLS = 10_000
#: Ended programs remembered so that their late events do not bring them back (oldest forgotten first).
MAX_ENDED = 100_000


class ProgramSignals:
    """A program's signals at one moment: idleness at once (every step ranks every program by
    it), readiness when first read. Predicting a tool's end is the costliest signal and a step
    reads it only for programs it might place, promote or warm (in bench_scheduler, a quarter of
    them). It is computed from the program as it is then, so a view of the live state is read
    before the state changes (the simulator's step; the gateway plans on a snapshot)."""

    __slots__ = ("idleness", "_program", "_predict", "_readiness")

    def __init__(self, idleness: float, program: ProgramState, predict: Callable[[ProgramState], Readiness]) -> None:
        self.idleness = idleness
        self._program, self._predict = program, predict
        self._readiness: Readiness | None = None

    @property
    def readiness(self) -> Readiness:
        if self._readiness is None:
            self._readiness = self._predict(self._program)
        return self._readiness


@dataclass(frozen=True, slots=True)
class View:
    """What a policy sees: the state (read-only by contract) and the signals at ``now``."""

    now: float
    programs: Mapping[str, ProgramState]
    workers: Mapping[str, WorkerState]
    signals: Mapping[str, ProgramSignals]
    adapter_versions: Mapping[str, str]
    handoffs: tuple[PendingHandoff, ...]
    agent_prefix_tokens: Mapping[str, int]
    cfg: SignalConfig
    #: per-worker sums over ``programs`` (what the arrival rules read instead of every program)
    totals: Totals
    #: GPU-tier size per worker as the last step planned it (maitred sizes it beyond the GPU)
    tier_tokens: Mapping[str, int]
    #: assignments made so far (round robin's cursor lives in the state, not in the policy)
    assignments_made: int
    #: which warmups the driver can send (read-only by contract)
    prompts: Prompts

    def healthy_workers(self) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.healthy]


def _predictor(history: ToolHistory, now: float, cfg: SignalConfig, use_signature: bool) -> Callable[[ProgramState], Readiness]:
    """Readiness at ``now`` as a function of the program alone: one per step, shared by all."""
    return partial(readiness, history=history, now=now, cfg=cfg, use_signature=use_signature)


def program_signals(p: ProgramState, history: ToolHistory, now: float, cfg: SignalConfig, use_signature: bool) -> ProgramSignals:
    return ProgramSignals(idleness(p, now, cfg.idleness_cycles), p, _predictor(history, now, cfg, use_signature))


def compute_signals(
    programs: Mapping[str, ProgramState],
    history: ToolHistory,
    now: float,
    cfg: SignalConfig,
    use_signature: bool,
    table: IdlenessInputs | None = None,
) -> dict[str, ProgramSignals]:
    """``table``: the programs' idleness inputs (a snapshot's), for idleness all at once."""
    predict = _predictor(history, now, cfg, use_signature)
    if table is None:
        cycles = cfg.idleness_cycles
        return {pid: ProgramSignals(idleness(p, now, cycles), p, predict) for pid, p in programs.items()}
    values, slots = table.at(now), table.slots
    return {pid: ProgramSignals(values[slots[pid]], p, predict) for pid, p in programs.items()}


class LazySignals(Mapping[str, ProgramSignals]):
    """Each program's signals computed when first read: for a question about one program on the
    gateway's event loop (a new program's first request), which must not pay for every
    program's readiness."""

    def __init__(
        self, programs: Mapping[str, ProgramState], history: ToolHistory, now: float, cfg: SignalConfig, use_signature: bool
    ) -> None:
        self._programs, self._history, self._now, self._cfg, self._use_signature = programs, history, now, cfg, use_signature
        self._done: dict[str, ProgramSignals] = {}

    def __getitem__(self, program_id: str) -> ProgramSignals:
        signals = self._done.get(program_id)
        if signals is None:
            signals = self._done[program_id] = program_signals(
                self._programs[program_id], self._history, self._now, self._cfg, self._use_signature
            )
        return signals

    def __iter__(self) -> Iterator[str]:
        return iter(self._programs)

    def __len__(self) -> int:
        return len(self._programs)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A private copy of the state at one moment. ``view(now)`` computes the signals on it, so
    the whole policy step — signals included — can run in another thread."""

    programs: Mapping[str, ProgramState]
    workers: Mapping[str, WorkerState]
    history: ToolHistory
    adapter_versions: Mapping[str, str]
    handoffs: tuple[PendingHandoff, ...]
    agent_prefix_tokens: Mapping[str, int]
    cfg: SignalConfig
    use_signature: bool
    tier_tokens: Mapping[str, int]
    assignments_made: int
    idleness: IdlenessInputs
    totals: Totals
    prompts: Prompts

    def view(self, now: float) -> View:
        return View(
            now=now,
            programs=self.programs,
            workers=self.workers,
            signals=compute_signals(self.programs, self.history, now, self.cfg, self.use_signature, self.idleness),
            adapter_versions=self.adapter_versions,
            handoffs=pending_at(self.handoffs, now),
            agent_prefix_tokens=self.agent_prefix_tokens,
            cfg=self.cfg,
            totals=self.totals,
            tier_tokens=self.tier_tokens,
            assignments_made=self.assignments_made,
            prompts=self.prompts,
        )


def pending_at(handoffs: Iterable[PendingHandoff], now: float) -> tuple[PendingHandoff, ...]:
    """The handoffs still pending at ``now``: one whose consumer has not asked within
    ``HANDOFF_TTL_S`` is stale (its consumer never started, or asked without saying its agent)."""
    return tuple(h for h in handoffs if now - h.ts <= HANDOFF_TTL_S)


def _copy_program(p: ProgramState) -> ProgramState:
    """A copy no later change of ``p`` reaches (residency entries are replaced, never mutated)."""
    return replace(
        p,
        tool=replace(p.tool) if p.tool is not None else None,
        residency=dict(p.residency),
        cycles=deque(p.cycles, maxlen=p.cycles.maxlen),
    )


def _copy_stats(s: DurationStats) -> DurationStats:
    return DurationStats(n=s.n, mean=s.mean, m2=s.m2, lo=s.lo, hi=s.hi, recent=deque(s.recent, maxlen=s.recent.maxlen))


def _copy_history(h: ToolHistory) -> ToolHistory:
    out = ToolHistory()
    out.by_signature = {k: _copy_stats(v) for k, v in h.by_signature.items()}
    out.by_tool = {k: _copy_stats(v) for k, v in h.by_tool.items()}
    out.overall = _copy_stats(h.overall)
    return out


class _Programs(dict[str, ProgramState]):
    """The live program table; remembers which ids were added or removed since the last
    snapshot (``dirty``) and since the totals were last read (``changed``), also when a caller
    (a test) fills it directly."""

    def __init__(self) -> None:
        super().__init__()
        self.dirty: set[str] = set()
        self.changed: set[str] = set()

    def mark(self, key: str) -> None:
        self.dirty.add(key)
        self.changed.add(key)

    def __setitem__(self, key: str, value: ProgramState) -> None:
        self.mark(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.mark(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.mark(key)
        return super().pop(key, *default)


class RuntimeState:
    def __init__(
        self, workers: Iterable[WorkerState] = (), cfg: SignalConfig | None = None, *, use_signature: bool = True
    ) -> None:
        self.cfg = cfg or SignalConfig()
        self.use_signature = use_signature
        self.programs: _Programs = _Programs()
        self.workers: dict[str, WorkerState] = {w.worker_id: w for w in workers}
        self.history = ToolHistory()
        self.predictions = PredictionLog()
        self.adapter_versions: dict[str, str] = {}
        self.handoffs: list[PendingHandoff] = []
        #: GPU-tier size per worker as the policy last planned it (maitred sizes it by the busy
        #: set, beyond the GPU); admission at once holds to it. Default: the worker's GPU.
        self.tier_tokens: dict[str, int] = {}
        self.agent_prefix_tokens: dict[str, int] = {}
        self.assignments_made = 0
        self.prompts = Prompts()
        self._totals = TotalsKeeper(self.cfg.reserve_tokens)
        self._totals.changed = self.programs.changed
        self._copies: dict[str, ProgramState] = {}
        self._idleness = IdlenessTable(self.cfg.idleness_cycles)  # the copies' idleness inputs
        self._history_copy: ToolHistory | None = None
        self._late_tools: OrderedDict[tuple[str, str], OpenTool] = OrderedDict()
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._early_ends: OrderedDict[tuple[str, str], ToolEnd] = OrderedDict()
        self._children: dict[str, set[str]] = {}  # parent -> children started and not ended

    def touch(self, program_id: str) -> None:
        """Mark a program changed, so the next snapshot copies it again and the totals recount it."""
        self.programs.mark(program_id)

    def totals(self) -> Totals:
        """The per-worker sums, brought up to date from the programs changed since the last read."""
        return self._totals.read(self.programs)

    def discard(self, program_id: str) -> None:
        """Forget a program the gateway created for a request it then refused: nothing of it
        stays behind (unlike ``program.end``, later events may bring it back)."""
        self.programs.pop(program_id, None)
        self.handoffs = [h for h in self.handoffs if h.program_id != program_id]
        self._children.pop(program_id, None)

    def speaker(self, program_id: str) -> str:
        """The program a model request naming ``program_id`` comes from, for clients that do
        not say which subagent asks (Claude Code before ``x-claude-code-agent-id``, or behind a
        proxy that drops it). Such subagents send their parent's session id, so a request
        naming a parent is its one running child's when the parent cannot be asking itself: it
        is blocked on a tool call (a foreground subagent's ``Agent`` call) or waiting (on a
        person, or on its background work). With two children running, or a parent between its
        own steps, it is not knowable: the request stays the parent's."""
        children = self._children.get(program_id)
        if not children:
            return program_id
        running = [c for c in children if c in self.programs]
        if len(running) != len(children):
            self._children[program_id] = set(running)  # children that expired without an end
        p = self.programs.get(program_id)
        if len(running) != 1 or p is None:
            return program_id
        blocked = p.tool is not None and p.tool.ended_at is None
        if blocked or p.awaiting_background or p.phase is Phase.WAITING_HUMAN:
            return running[0]
        return program_id

    def restore(self, events: Iterable[Event]) -> list[str]:
        """Programs rebuilt from their stored events, for a gateway restarted on the same store
        (``SessionStore.open_program_events``: the recent events of programs not ended).

        Rebuilt from the event history rather than from a snapshot table: the store already
        holds every event the runtime applied, so replaying them through ``apply`` gives back
        phase, open tool call, context size, agent, residency and the idleness cycles with no
        new table, no extra write on the serving path and no snapshot to fall behind the
        events. What events do not carry are the scheduler's decisions, and they are re-derived:
        a program's home is the configured worker its KV was last observed on (an ``llm.end``
        naming it), in the GPU tier there, so its next request goes straight back to the cache
        it left; the first step re-tiers from there by idleness within capacities, as it would
        after any change. A program whose worker is no longer configured is homeless and waits
        for placement. Measured (``benchmarks/bench_restore.py``, 10,000 open programs of 11
        events among 230,000 stored): reading 0.84 s and replaying 0.52 s on SQLite, 0.96 s and
        0.39 s on PostgreSQL, once, before the first request; a snapshot table would have cost
        a write per decision for ever to save that second at start.

        The replay runs on a scratch state so the tool history is not counted a second time
        (it is seeded from the store's statistics); programs the live state already has (a
        request came first) are left as they are. Returns the ids restored."""
        scratch = RuntimeState(cfg=self.cfg, use_signature=self.use_signature)
        for e in events:
            scratch.apply(e)
        restored = []
        for pid, p in scratch.programs.items():
            if pid in self.programs or pid in self._ended:
                continue
            p.residency = {k: r for k, r in p.residency.items() if k[0] in self.workers}
            last = max(p.residency.items(), key=lambda item: item[1].observed_at, default=None)
            p.home_worker = last[0][0] if last is not None else None
            p.tier = Tier.GPU if p.home_worker is not None else Tier.WAITING
            p.lazy_demote = False
            self.programs[pid] = p
            if p.parent_program_id is not None:
                self._children.setdefault(p.parent_program_id, set()).add(pid)
            restored.append(pid)
        for adapter, version in scratch.adapter_versions.items():
            self.adapter_versions.setdefault(adapter, version)
        for agent, tokens in scratch.agent_prefix_tokens.items():
            self.agent_prefix_tokens.setdefault(agent, tokens)
        return restored

    # -- workers ------------------------------------------------------------------------------

    def add_worker(self, worker: WorkerState) -> None:
        self.workers[worker.worker_id] = worker

    def set_worker_health(self, worker_id: str, healthy: bool) -> None:
        """A worker that goes down loses its programs' KV: they become homeless and wait for
        placement elsewhere (the gateway retries their requests; clients see no error)."""
        worker = self.workers[worker_id]
        worker.healthy = healthy
        self.tier_tokens.pop(worker_id, None)  # sized for what the worker was; the next step re-sizes it
        if healthy:
            return
        for p in self.programs.values():
            if p.home_worker == worker_id:
                p.home_worker, p.tier, p.lazy_demote = None, Tier.WAITING, False
                p.residency = {k: v for k, v in p.residency.items() if k[0] != worker_id}
                self.touch(p.program_id)

    def observe_worker(
        self,
        worker_id: str,
        *,
        queued_requests: int | None = None,
        used_tokens: int | None = None,
        warmups_in_flight: int | None = None,
    ) -> None:
        """What the engine reports of its own load (SGLang ``/v1/loads``); None leaves a field as is."""
        w = self.workers[worker_id]
        if queued_requests is not None:
            w.queued_requests = queued_requests
        if used_tokens is not None:
            w.used_tokens = used_tokens
        if warmups_in_flight is not None:
            w.warmups_in_flight = warmups_in_flight

    def seed_history(self, rows: Iterable[StatsRow], *, signatures: bool = False) -> None:
        self.history.seed(rows, signatures=signatures)
        self._history_copy = None

    # -- events -------------------------------------------------------------------------------

    def program_for(self, event: Event) -> ProgramState:
        p = self.programs.get(event.program_id)
        if p is None:
            p = self.programs[event.program_id] = ProgramState(event.program_id, agent=event.agent, phase_since=event.ts)
        return p

    def _enter(self, p: ProgramState, phase: Phase, ts: float) -> None:
        """Close the time spent in the old phase; a new reasoning phase after acting starts a cycle."""
        spent = max(ts - p.phase_since, 0.0)
        if p.phase is Phase.REASONING:
            p.open_reason_s += spent
        else:
            p.open_act_s += spent
        if phase is Phase.REASONING and p.phase is not Phase.REASONING and p.open_reason_s + p.open_act_s > 0:
            p.cycles.append((p.open_reason_s, p.open_act_s))
            p.open_reason_s = p.open_act_s = 0.0
        p.phase, p.phase_since = phase, max(ts, p.phase_since)
        p.awaiting_background = False

    def apply(self, event: Event) -> None:
        """Events stamped at or before their program's end are late news of a finished program
        (a proxy logs a step's ``llm.end`` after answering, hooks race): they never bring it
        back, where it would be placed and hold GPU room; a late ``tool.end`` still teaches the
        tool history. Events after the end are a new life of the program (a resumed session)."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return
        ended_at = self._ended.get(event.program_id)
        if ended_at is not None:
            if event.ts <= ended_at:
                if isinstance(event, ToolEnd):
                    self._tool_end(event)
                return
            del self._ended[event.program_id]
        self.touch(event.program_id)
        handler(self, event)

    def _program_start(self, e: ProgramStart) -> None:
        p = self.program_for(e)
        p.agent = e.agent or p.agent
        self._agent_prefix(p)
        p.parent_program_id = e.parent_program_id
        if e.parent_program_id is not None:
            self._children.setdefault(e.parent_program_id, set()).add(e.program_id)

    def _program_end(self, e: ProgramEnd) -> None:
        p = self.programs.pop(e.program_id, None)
        if p is not None and p.parent_program_id is not None:
            siblings = self._children.get(p.parent_program_id)
            if siblings is not None:
                siblings.discard(e.program_id)
                if not siblings:
                    del self._children[p.parent_program_id]
        self._children.pop(e.program_id, None)
        self._ended[e.program_id] = e.ts
        if len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)
        self.handoffs = [h for h in self.handoffs if h.program_id != e.program_id]

    def _llm_start(self, e: LLMStart) -> None:
        p = self.program_for(e)
        if e.agent and e.agent != p.agent:
            p.agent = e.agent
        self._enter(p, Phase.REASONING, e.ts)
        if p.tool is not None and p.tool.ended_at is None:
            self._stash_late(p.program_id, p.tool)
        p.returned, p.tool = False, None
        if e.prompt_tokens is not None:
            p.context_tokens = e.prompt_tokens
            self._learn_handoff_prefix(p, e.prompt_tokens)
            self._learn_prefix(p, e.prompt_tokens)
        if e.model:
            p.model = e.model
        # The consumer asked. A request that does not say its agent (the gateway's) is taken to
        # be the consumer's: after a handoff, the program's next request is.
        self.handoffs = [
            h for h in self.handoffs if not (h.program_id == p.program_id and (e.agent is None or h.to_agent == p.agent))
        ]

    def _learn_handoff_prefix(self, p: ProgramState, prompt_tokens: int) -> None:
        """An agent first seen as a handoff's consumer (a coder that only ever starts from a
        planner's handoff, so ``_learn_prefix`` never sees its first prompt): its first prompt less
        the shared context is its system prompt, which the next handoff's warmup must include."""
        if not p.agent or p.agent in self.agent_prefix_tokens:
            return
        for h in self.handoffs:
            if h.program_id == p.program_id and h.to_agent == p.agent and h.expected_prompt_tokens is None:
                self.agent_prefix_tokens[p.agent] = max(prompt_tokens - h.context_tokens, 0)
                return

    def _learn_prefix(self, p: ProgramState, prompt_tokens: int) -> None:
        """An agent's first prompt is (mostly) its system prompt: the prefix a handoff to it
        shares, and its programs on one worker share. The shortest first prompt of its programs
        is the closest bound on it: each first prompt is that prefix plus the program's task.

        A program's agent often comes with its ``program.start`` after its first request (the
        middleware batches events; a request through the gateway names no agent), so the first
        prompt is kept and learned from once the agent is known (``_agent_prefix``)."""
        if not p.cycles and p.first_prompt_tokens is None:
            p.first_prompt_tokens = prompt_tokens
            self._agent_prefix(p)

    def _agent_prefix(self, p: ProgramState) -> None:
        if p.agent and p.first_prompt_tokens is not None:
            known = self.agent_prefix_tokens.get(p.agent)
            self.agent_prefix_tokens[p.agent] = p.first_prompt_tokens if known is None else min(known, p.first_prompt_tokens)

    def _llm_end(self, e: LLMEnd) -> None:
        p = self.program_for(e)
        p.context_tokens = e.prompt_tokens + e.completion_tokens
        if e.worker:
            key = (e.worker, p.model, p.adapter, p.adapter_version)
            p.residency[key] = Residency(p.context_tokens, e.ts)
        if p.phase is Phase.REASONING:
            self._enter(p, Phase.ACTING, e.ts)

    def tool_for(self, program_id: str, call_id: str) -> OpenTool | None:
        """The open (or late, see ``_tool_start``) tool call a ``tool.end`` would close."""
        p = self.programs.get(program_id)
        if p is not None and p.tool is not None and p.tool.call_id == call_id:
            return p.tool
        return self._late_tools.get((program_id, call_id))

    def _stash_late(self, program_id: str, tool: OpenTool) -> None:
        self._late_tools[(program_id, tool.call_id)] = tool
        if len(self._late_tools) > MAX_LATE_TOOLS:
            self._late_tools.popitem(last=False)

    def _tool_start(self, e: ToolStart) -> None:
        """Events come through a batched channel while model requests reach the gateway at
        once, so a tool's events may arrive after the step that followed it began: such a
        ``tool.start`` (older than the running step) only waits for its end, for the history.
        Concurrent hooks may even deliver a fast tool's end before its start: the start then
        closes the call at once instead of leaving it open until the next one."""
        p = self.program_for(e)
        tool = OpenTool(e.call_id, e.tool, e.signature, e.ts, e.deadline_s)
        early = self._early_ends.pop((p.program_id, e.call_id), None)
        if early is not None:  # its end came first (hooks run concurrently): a finished call
            self._record_tool(tool, early)
            p.returned = p.returned or p.phase is Phase.ACTING
            return
        if p.phase is Phase.REASONING and e.ts < p.phase_since:
            self._stash_late(p.program_id, tool)
            return
        self._enter(p, Phase.ACTING, e.ts)
        p.tool = tool
        p.returned = False

    def _tool_progress(self, e: ToolProgress) -> None:
        p = self.programs.get(e.program_id)
        if p is not None and p.tool is not None and p.tool.call_id == e.call_id and e.eta_s is not None:
            p.tool.eta_s, p.tool.eta_at = e.eta_s, e.ts

    def _tool_end(self, e: ToolEnd) -> None:
        p = self.programs.get(e.program_id)
        if p is None or p.tool is None or p.tool.call_id != e.call_id:
            late = self._late_tools.pop((e.program_id, e.call_id), None)
            if late is not None:
                self._record_tool(late, e)
            elif p is not None:
                self._early_ends[(e.program_id, e.call_id)] = e
                if len(self._early_ends) > MAX_LATE_TOOLS:
                    self._early_ends.popitem(last=False)
            return
        self._record_tool(p.tool, e)
        p.returned = True

    def _record_tool(self, tool: OpenTool, e: ToolEnd) -> None:
        end_ts = e.ts
        duration = e.duration_s if e.duration_s is not None else end_ts - tool.started
        predicted, _, _ = predict_end(tool, self.history, end_ts, self.cfg, use_signature=self.use_signature)
        if predicted is not None:
            self.predictions.record(predicted, tool.started + duration)
        self.history.record(tool.tool, tool.signature, duration)
        self._history_copy = None
        tool.ended_at = end_ts

    def _handoff(self, e: Handoff) -> None:
        tokens = e.context_tokens
        if tokens is None and e.messages:
            tokens = sum(len(str(m.get("content", ""))) for m in e.messages) // CHARS_PER_TOKEN
        expected = len(e.expected_prompt) // CHARS_PER_TOKEN if e.expected_prompt else None
        target = e.child_program_id or e.program_id
        for i, h in enumerate(self.handoffs):
            if h.program_id == target and h.to_agent == e.to_agent:
                self.handoffs[i] = replace(h, consumers=h.consumers + 1)
                return
        self.handoffs.append(PendingHandoff(target, e.to_agent, tokens or 0, e.ts, expected))
        self.handoffs = [h for h in self.handoffs if e.ts - h.ts <= HANDOFF_TTL_S]

    def _wait(self, e: ProgramWait) -> None:
        """A wait on a person, or (reason ``background``) on the program's own background work,
        which reports back by itself: that counts as acting, like waiting on a tool."""
        p = self.program_for(e)
        background = e.reason == BACKGROUND_WAIT
        self._enter(p, Phase.ACTING if background else Phase.WAITING_HUMAN, e.ts)
        p.awaiting_background = background
        p.returned = False

    def _resume(self, e: ProgramResume) -> None:
        p = self.program_for(e)
        self._enter(p, Phase.ACTING, e.ts)
        p.returned = True

    def _adapter_publish(self, e: AdapterPublish) -> None:
        self.adapter_versions[e.adapter] = e.version
        for p in self.programs.values():
            if p.adapter == e.adapter:
                p.adapter_version = e.version
                self.touch(p.program_id)

    # -- gateway-side facts -------------------------------------------------------------------

    def request_arrived(
        self,
        program_id: str,
        ts: float,
        *,
        agent: str | None = None,
        model: str | None = None,
        adapter: str | None = None,
        prompt_tokens: int | None = None,
    ) -> ProgramState:
        """A model request reached the gateway: from now on the program wants the GPU (time held
        in the gateway counts as reasoning)."""
        self.apply(
            LLMStart(ts=ts, program_id=program_id, agent=agent, request_id="gateway", model=model, prompt_tokens=prompt_tokens)
        )
        p = self.programs[program_id]
        if adapter is not None:
            p.adapter = adapter
            p.adapter_version = self.adapter_versions.get(adapter)
        return p

    def gpu_used(self) -> dict[str, int]:
        """GPU-tier tokens (with the admission reserve) on each worker, from the totals."""
        totals = self.totals()
        return {w: totals.worker(w).gpu_weight for w in self.workers}

    def force_admit(self, program_id: str, worker_id: str) -> None:
        """The gateway let a held request through after its bounded wait (no request waits
        forever). Record that the program now occupies the GPU of ``worker_id``, so the next
        step makes room for it on purpose instead of leaving the engine to evict blindly."""
        p = self.programs.get(program_id)
        if p is not None:
            p.home_worker, p.tier, p.lazy_demote = worker_id, Tier.GPU, False
            self.touch(program_id)

    # -- decisions ----------------------------------------------------------------------------

    def apply_decision(self, decision: Decision) -> None:
        self.tier_tokens.update(decision.tier_tokens)
        for move in decision.tier_moves:
            p = self.programs.get(move.program_id)
            if p is None:
                continue
            self.touch(move.program_id)
            if move.lazy:
                if not p.lazy_demote:
                    p.lazy_demote, p.lazy_since = True, p.phase_since if move.since is None else move.since
            else:
                p.tier, p.lazy_demote = move.dst, False
        for a in decision.assignments:
            p = self.programs.get(a.program_id)
            if p is not None:
                p.home_worker, p.tier, p.lazy_demote = a.worker, Tier.GPU, False
                self.assignments_made += 1
                self.touch(a.program_id)

    # -- snapshot -----------------------------------------------------------------------------

    def signals(self, now: float) -> dict[str, ProgramSignals]:
        return compute_signals(self.programs, self.history, now, self.cfg, self.use_signature)

    def signals_of(self, p: ProgramState, now: float) -> ProgramSignals:
        return program_signals(p, self.history, now, self.cfg, self.use_signature)

    def view(self, now: float, *, lazy: bool = False) -> View:
        """The live state as a view: for a caller that plans and applies in one thread (the
        simulator, or the gateway's arrival rule), where nothing can change in between.
        ``lazy``: signals computed only for the programs the caller reads."""
        signals: Mapping[str, ProgramSignals] = (
            LazySignals(self.programs, self.history, now, self.cfg, self.use_signature) if lazy else self.signals(now)
        )
        return View(
            now=now,
            programs=self.programs,
            workers=self.workers,
            signals=signals,
            adapter_versions=self.adapter_versions,
            handoffs=pending_at(self.handoffs, now),
            agent_prefix_tokens=self.agent_prefix_tokens,
            cfg=self.cfg,
            totals=self.totals(),
            tier_tokens=self.tier_tokens,
            assignments_made=self.assignments_made,
            prompts=self.prompts,
        )

    def snapshot(self) -> Snapshot:
        """A private copy for a policy step in another thread (see the module docstring)."""
        dirty = self.programs.dirty
        for pid in dirty:
            p = self.programs.get(pid)
            if p is None:
                self._copies.pop(pid, None)
                self._idleness.drop(pid)
            else:
                copy = self._copies[pid] = _copy_program(p)
                self._idleness.put(copy)
        dirty.clear()
        if self._history_copy is None:
            self._history_copy = _copy_history(self.history)
        # in the live table's order (not the dirty set's, which follows string hashes and so differs
        # between processes): the step must tie-break alike in the gateway and the replay, every run
        copies = self._copies
        return Snapshot(
            programs=MappingProxyType({pid: copies[pid] for pid in self.programs}),
            workers=MappingProxyType({k: replace(w) for k, w in self.workers.items()}),
            history=self._history_copy,
            adapter_versions=MappingProxyType(dict(self.adapter_versions)),
            handoffs=tuple(self.handoffs),
            agent_prefix_tokens=MappingProxyType(dict(self.agent_prefix_tokens)),
            cfg=self.cfg,
            use_signature=self.use_signature,
            tier_tokens=MappingProxyType(dict(self.tier_tokens)),
            assignments_made=self.assignments_made,
            idleness=self._idleness.inputs(),
            totals=self.totals().copy(),
            prompts=self.prompts.copy(),
        )


_HANDLERS: dict[type[Event], Callable[[RuntimeState, Any], None]] = {
    ProgramStart: RuntimeState._program_start,
    ProgramEnd: RuntimeState._program_end,
    LLMStart: RuntimeState._llm_start,
    LLMEnd: RuntimeState._llm_end,
    ToolStart: RuntimeState._tool_start,
    ToolProgress: RuntimeState._tool_progress,
    ToolEnd: RuntimeState._tool_end,
    Handoff: RuntimeState._handoff,
    ProgramWait: RuntimeState._wait,
    ProgramResume: RuntimeState._resume,
    AdapterPublish: RuntimeState._adapter_publish,
}
