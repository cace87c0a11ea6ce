"""MORI's sticky three-tier placement, per worker, ranked by relative idleness.

Nothing moves while both capacities hold. When the GPU tier is over capacity, the most idle
*acting* program goes down to host memory (or is dropped when the host tier cannot take it);
if every GPU program is mid-step, the most idle is marked for lazy demotion when its step ends.
When the host tier is over capacity, its most idle program is dropped to ``waiting``. When the
GPU has room, host-tier programs come back up: first those whose tool has ended (least idle
first), then those about to return (r = 1) — promotion ahead of the return. A demoted program's
host copy stays on its home worker and promotion brings it back there (affinity).
"""

from collections import defaultdict
from dataclasses import dataclass, field

from maitred.runtime.decisions import TierMove
from maitred.runtime.model import Phase, ProgramState, Tier
from maitred.runtime.state import View


@dataclass
class TierPlan:
    moves: list[TierMove] = field(default_factory=list)
    tiers: dict[str, Tier] = field(default_factory=dict)   # tier of every homed program after the moves
    lazy: set[str] = field(default_factory=set)

    def gpu_free(self, view: View) -> dict[str, int]:
        """Free GPU tokens per healthy worker once these moves are done (lazy ones not yet)."""
        reserve = view.cfg.reserve_tokens
        free = {w.worker_id: w.gpu_tokens for w in view.healthy_workers()}
        for pid, tier in self.tiers.items():
            p = view.programs[pid]
            if tier is Tier.GPU and p.home_worker in free:
                free[p.home_worker] -= p.weight(reserve)
        return free


def plan_tiers(view: View, *, promote_waiting: bool) -> TierPlan:
    plan = TierPlan()
    by_worker: dict[str, list[ProgramState]] = defaultdict(list)
    for p in view.programs.values():
        if p.home_worker is not None and p.home_worker in view.workers:
            by_worker[p.home_worker].append(p)
            plan.tiers[p.program_id] = p.tier
    for worker_id, programs in by_worker.items():
        _plan_worker(view, worker_id, programs, plan, promote_waiting)
    return plan


def _plan_worker(view: View, worker_id: str, programs: list[ProgramState], plan: TierPlan, promote_waiting: bool) -> None:
    worker = view.workers[worker_id]
    reserve = view.cfg.reserve_tokens
    iota = {p.program_id: view.signals[p.program_id].idleness for p in programs}
    tiers = plan.tiers

    def used(tier: Tier) -> int:
        return sum(p.weight(reserve) for p in programs if tiers[p.program_id] is tier and p.program_id not in plan.lazy)

    def move(p: ProgramState, dst: Tier) -> None:
        plan.moves.append(TierMove(p.program_id, worker_id, tiers[p.program_id], dst))
        tiers[p.program_id] = dst

    def demote(p: ProgramState) -> None:
        move(p, Tier.CPU if p.weight(reserve) <= worker.cpu_tokens else Tier.WAITING)

    for p in programs:  # lazy demotions whose step has ended
        if p.lazy_demote and tiers[p.program_id] is Tier.GPU and p.phase is not Phase.REASONING:
            demote(p)

    gpu = sorted((p for p in programs if tiers[p.program_id] is Tier.GPU), key=lambda p: -iota[p.program_id])
    over = used(Tier.GPU) - worker.gpu_tokens
    for p in gpu:
        if over <= 0:
            break
        if p.phase is not Phase.REASONING:
            demote(p)
            over -= p.weight(reserve)
    for p in gpu:
        if over <= 0:
            break
        if p.phase is Phase.REASONING and tiers[p.program_id] is Tier.GPU:
            plan.moves.append(TierMove(p.program_id, worker_id, Tier.GPU, Tier.CPU, lazy=True))
            plan.lazy.add(p.program_id)
            over -= p.weight(reserve)

    cpu_over = used(Tier.CPU) - worker.cpu_tokens
    for p in sorted((p for p in programs if tiers[p.program_id] is Tier.CPU), key=lambda p: -iota[p.program_id]):
        if cpu_over <= 0:
            break
        move(p, Tier.WAITING)
        cpu_over -= p.weight(reserve)

    if over > 0:
        return
    free = worker.gpu_tokens - used(Tier.GPU)
    sources = (Tier.CPU, Tier.WAITING) if promote_waiting else (Tier.CPU,)
    ready = [p for p in programs if tiers[p.program_id] in sources and view.signals[p.program_id].readiness.r == 1]
    # Returned (or mid-request) programs first, then those predicted to return; least idle first.
    ready.sort(key=lambda p: (not (p.returned or p.phase is Phase.REASONING), iota[p.program_id]))
    for p in ready:
        if p.weight(reserve) <= free:
            move(p, Tier.GPU)
            free -= p.weight(reserve)
