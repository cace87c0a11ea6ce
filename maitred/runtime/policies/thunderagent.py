"""ThunderAgent's policy, as the baseline to beat (no host tier).

When a worker's active programs outgrow its KV capacity, acting programs are paused smallest
first (their KV is dropped); programs that want the GPU again — and new ones — are resumed by
best-fit decreasing onto whichever worker has room, with no regard for where their cache was.
"""

from maitred.runtime.decisions import Assignment, Decision
from maitred.runtime.model import Tier
from maitred.runtime.placement import Item, signature, solve_bfd, wants_gpu
from maitred.runtime.policies.base import finish, pause_until_fits
from maitred.runtime.state import View


class ThunderAgent:
    name = "thunderagent"

    def step(self, view: View) -> Decision:
        reserve = view.cfg.reserve_tokens
        tiers, free, moves = pause_until_fits(view, lambda p, _worker: p.weight(reserve))
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
