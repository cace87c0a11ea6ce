"""Per-worker aggregates of the live program table, kept incrementally.

A new program's first request is decided on the gateway's event loop, where nothing may walk
every program: at 10,000 programs known that walk cost 236 ms per request and starved the
health checks. The arrival rules of every policy read only these sums — GPU-tier use, what
ThunderAgent counts as active, the paused pool, where each agent's programs live — and the
state refreshes them from the programs changed since the last read (the same dirty set that
keeps its snapshots cheap), so a read costs O(changed), not O(programs).
"""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from maitred.runtime.records import Phase, ProgramState, Tier


@dataclass(frozen=True, slots=True)
class Share:
    """One program's part in the sums, as it was when last counted."""

    home: str | None
    tier: Tier
    reasoning: bool
    weight: int  # context + the admission reserve
    context: int
    agent: str


@dataclass(slots=True)
class WorkerTotals:
    gpu_weight: int = 0  # GPU-tier tokens with the reserve (maitred, MORI, admission)
    gpu_programs: int = 0  # GPU-tier programs (ThunderAgent's active set)
    gpu_reasoning_context: int = 0
    gpu_acting_context: int = 0
    homed_programs: int = 0  # programs whose home is this worker (any tier)
    homed_context: int = 0
    homed_off_gpu: int = 0  # homed here but not in the GPU tier (ThunderAgent's paused pool)
    #: GPU-tier programs mid-step per agent: how often the running set counts each system prompt
    gpu_reasoning_agents: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Totals:
    """The sums over every program, read by the arrival rules (read-only by contract)."""

    workers: dict[str, WorkerTotals] = field(default_factory=dict)
    #: programs that want the GPU (a request waits) and are not in a GPU tier
    wanting_off_gpu: int = 0
    #: homeless programs with a request waiting (ThunderAgent's new programs in the paused pool)
    homeless_wanting: int = 0
    #: programs per (agent, home worker): where an agent's shared prefix is cached
    agent_homes: Counter[tuple[str, str]] = field(default_factory=Counter)

    def copy(self) -> "Totals":
        """A copy no later change reaches (for a snapshot): O(workers + agents), not O(programs)."""
        return Totals(
            {w: replace(t, gpu_reasoning_agents=Counter(t.gpu_reasoning_agents)) for w, t in self.workers.items()},
            self.wanting_off_gpu,
            self.homeless_wanting,
            Counter(self.agent_homes),
        )

    def worker(self, worker_id: str) -> WorkerTotals:
        return self.workers.get(worker_id) or WorkerTotals()

    def add(self, s: Share, sign: int) -> None:
        if s.reasoning and s.tier is not Tier.GPU:
            self.wanting_off_gpu += sign
        if s.home is None:
            self.homeless_wanting += sign * s.reasoning
            return
        w = self.workers.setdefault(s.home, WorkerTotals())
        w.homed_programs += sign
        w.homed_context += sign * s.context
        self.agent_homes[(s.agent, s.home)] += sign
        if s.tier is Tier.GPU:
            w.gpu_weight += sign * s.weight
            w.gpu_programs += sign
            if s.reasoning:
                w.gpu_reasoning_context += sign * s.context
                w.gpu_reasoning_agents[s.agent] += sign
            else:
                w.gpu_acting_context += sign * s.context
        else:
            w.homed_off_gpu += sign


def share_of(p: ProgramState, reserve_tokens: int) -> Share:
    return Share(p.home_worker, p.tier, p.phase is Phase.REASONING, p.weight(reserve_tokens), p.context_tokens, p.agent or "")


class TotalsKeeper:
    """``Totals`` brought up to date from the programs changed since the last read."""

    def __init__(self, reserve_tokens: int) -> None:
        self.reserve_tokens = reserve_tokens
        self.totals = Totals()
        self.changed: set[str] = set()
        self._shares: dict[str, Share] = {}

    def read(self, programs: Mapping[str, ProgramState]) -> Totals:
        for pid in self.changed:
            old = self._shares.pop(pid, None)
            if old is not None:
                self.totals.add(old, -1)
            p = programs.get(pid)
            if p is not None:
                new = self._shares[pid] = share_of(p, self.reserve_tokens)
                self.totals.add(new, +1)
        self.changed.clear()
        return self.totals
