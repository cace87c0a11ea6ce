"""MORI alone: sticky three-tier placement by relative idleness, with affinity.

Programs only ever return to their home worker (from host memory, or by recompute when their
KV was dropped); only programs without a usable home are placed, on the worker with the most
free GPU room (MORI's affinity-aware load balancing across replicas).
"""

from maitred.runtime.decisions import Assignment, Decision
from maitred.runtime.placement import signature, wants_gpu
from maitred.runtime.policies.base import finish
from maitred.runtime.state import View
from maitred.runtime.tiering import plan_tiers


class Mori:
    name = "mori"

    def step(self, view: View) -> Decision:
        plan = plan_tiers(view, promote_waiting=True)
        free = plan.gpu_free()
        homeless = [p for p in view.programs.values() if p.home_worker not in free and wants_gpu(p, view)]
        reserve = view.cfg.reserve_tokens
        assignments = []
        for p in sorted(homeless, key=lambda p: -p.weight(reserve)):
            worker = max(sorted(free), key=free.__getitem__, default=None)  # the most free room: spread the load
            if worker is not None and p.weight(reserve) <= free[worker]:
                assignments.append(Assignment(p.program_id, worker, "new" if p.home_worker is None else "failover", signature(p)))
                free[worker] -= p.weight(reserve)
        return finish(self.name, view, moves=plan.moves, assignments=assignments)
