"""MORI alone: sticky three-tier placement by relative idleness, with affinity.

Programs only ever return to their home worker (from host memory, or by recompute when their
KV was dropped); only programs without a usable home are placed, by best-fit decreasing.
"""

from maitred.runtime.decisions import Assignment, Decision
from maitred.runtime.placement import Item, signature, solve_bfd, wants_gpu
from maitred.runtime.policies.base import finish
from maitred.runtime.state import View
from maitred.runtime.tiering import plan_tiers


class Mori:
    name = "mori"

    def step(self, view: View) -> Decision:
        plan = plan_tiers(view, promote_waiting=True)
        free = plan.gpu_free()
        homeless = [p for p in view.programs.values() if p.home_worker not in free and wants_gpu(p, view)]
        workers = list(free)
        reserve = view.cfg.reserve_tokens
        items = [Item(p.program_id, p.weight(reserve), tuple((0, 0, 0) for _ in workers)) for p in homeless]
        placed = solve_bfd(items, [max(free[w], 0) for w in workers])
        assignments = [
            Assignment(p.program_id, workers[b], "new" if p.home_worker is None else "failover", signature(p))
            for p, b in zip(homeless, placed) if b is not None
        ]
        return finish(self.name, view, moves=plan.moves, assignments=assignments)
