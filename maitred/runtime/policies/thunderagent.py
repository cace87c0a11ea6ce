"""ThunderAgent's policy, as the baseline to beat (no host tier).

When a worker's active programs outgrow its KV capacity, acting programs are paused smallest
first (their KV is dropped); programs that want the GPU again — and new ones — are resumed by
best-fit decreasing onto whichever worker has room, with no regard for where their cache was.
"""

from maitred.runtime.decisions import Assignment, Decision, TierMove
from maitred.runtime.model import Phase, Tier
from maitred.runtime.placement import Item, signature, solve_bfd, wants_gpu
from maitred.runtime.policies.base import finish
from maitred.runtime.state import View


class ThunderAgent:
    name = "thunderagent"

    def step(self, view: View) -> Decision:
        reserve = view.cfg.reserve_tokens
        tiers = {pid: p.tier for pid, p in view.programs.items()}
        free = {w.worker_id: w.gpu_tokens for w in view.healthy_workers()}
        moves: list[TierMove] = []
        for p in view.programs.values():
            if tiers[p.program_id] is Tier.GPU and p.home_worker in free:
                free[p.home_worker] -= p.weight(reserve)
        for worker_id in free:
            acting = sorted(
                (p for p in view.programs.values()
                 if p.home_worker == worker_id and tiers[p.program_id] is Tier.GPU and p.phase is not Phase.REASONING),
                key=lambda p: p.weight(reserve),
            )
            for p in acting:
                if free[worker_id] >= 0:
                    break
                moves.append(TierMove(p.program_id, worker_id, Tier.GPU, Tier.WAITING))
                tiers[p.program_id] = Tier.WAITING
                free[worker_id] += p.weight(reserve)
        waiting = [
            p for p in view.programs.values()
            if (tiers[p.program_id] is not Tier.GPU or p.home_worker not in free) and wants_gpu(p, view)
        ]
        workers = list(free)
        items = [Item(p.program_id, p.weight(reserve), tuple((0, 0, 0) for _ in workers)) for p in waiting]
        plan = solve_bfd(items, [max(free[w], 0) for w in workers])
        assignments = [
            Assignment(p.program_id, workers[b], "new" if p.home_worker is None else "waiting", signature(p))
            for p, b in zip(waiting, plan) if b is not None
        ]
        return finish(self.name, view, moves=moves, assignments=assignments)
