"""``belady``: Belady's rule, size-aware, told each program's next request — a heuristic, not a bound.

The replay tells it when every program will next ask (``next_use``: the end of its remaining
tools and waits, from the trace); nothing real can know that, so it shows what knowing the
future buys a simple rule, not a policy to deploy. Every step, on every worker, the programs
are ranked by (time until their next request) × (their KV weight) — Belady's "evict what is
needed furthest in the future", weighed by the room it holds (as GreedyDual-Size does for
objects of different sizes) — and the GPU tier is filled in that order, then the host tier;
the rest wait. Reasoning programs rank first and are never moved mid-step. New programs go to
the worker with the most room.

It is named for its rule rather than called an oracle or a bound: Belady's rule is optimal for
one cache of equal-sized pages without a second tier, and none of that holds here (programs
differ in size, a host tier and transfer times sit between, admission and placement interact),
so other policies can and do beat it. The one upper bound the replay reports is ``unlimited``:
the same workload with unlimited GPU memory. Unlike the policies it keeps memory
(``next_use``, the future it is told), which is why only the replay can run it.
"""

from dataclasses import replace

from maitred.runtime.admission import Cadence
from maitred.runtime.decisions import Assignment, Decision, TierMove
from maitred.runtime.placement import signature
from maitred.runtime.policies.base import finish
from maitred.runtime.records import Phase, ProgramState, Tier
from maitred.runtime.state import View


class Belady:
    name = "belady"
    warms = False  # proposes no warmups
    cadence = Cadence(period_s=1.0, hold_s=1800.0, urgent_s=0.05)

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        return None

    def __init__(self) -> None:
        #: simulated time of each program's next request (set by whoever knows the future)
        self.next_use: dict[str, float] = {}

    def _key(self, p: ProgramState, view: View) -> tuple[int, float]:
        if p.phase is Phase.REASONING:
            return (0, 0.0)
        wait = max(self.next_use.get(p.program_id, view.now + 3600.0) - view.now, 0.0)
        return (1, wait * p.weight(view.cfg.reserve_tokens))

    def step(self, view: View) -> Decision:
        reserve = view.cfg.reserve_tokens
        healthy = sorted(w.worker_id for w in view.healthy_workers())
        gpu_room = {w: view.workers[w].gpu_tokens for w in healthy}
        cpu_room = {w: view.workers[w].cpu_tokens for w in healthy}
        order = sorted(view.programs.values(), key=lambda p: (self._key(p, view), p.program_id))
        moves: list[TierMove] = []
        assignments: list[Assignment] = []
        keep: dict[str, int] = {}
        for rank, p in enumerate(order):
            keep[p.program_id] = len(order) - rank
            weight = p.weight(reserve)
            home = p.home_worker if p.home_worker in gpu_room else None
            mid_step = p.phase is Phase.REASONING and home is not None and p.tier is Tier.GPU
            if home is None:
                if p.phase is not Phase.REASONING or not gpu_room:
                    continue
                worker = max(healthy, key=gpu_room.__getitem__)
                if weight <= gpu_room[worker]:
                    gpu_room[worker] -= weight
                    assignments.append(Assignment(p.program_id, worker, "new", signature(p)))
                continue
            if mid_step or weight <= gpu_room[home]:
                gpu_room[home] -= weight
                dst = Tier.GPU
            elif weight <= cpu_room[home] and p.tier is not Tier.WAITING:
                cpu_room[home] -= weight
                dst = Tier.CPU
            else:
                dst = Tier.WAITING
            if dst is not p.tier:
                moves.append(TierMove(p.program_id, home, p.tier, dst))
        decision = finish(self.name, view, moves=moves, assignments=assignments)
        return replace(decision, priorities=keep)
