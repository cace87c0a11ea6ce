"""MORI as published (arXiv 2026; seed text "How MORI Works"), the offloading baseline to beat.

Three tiers per worker ranked by relative idleness (``maitred/runtime/tiering.py``): sticky
placement, the most idle acting program demoted when the GPU tier is over capacity, lazy
demotion of reasoning ones, and a boundary that moves with the busy set — a program that wants
the GPU now squeezes out the most idle ones (``displace``); demotion ranks by idleness alone.
It runs on ThunderAgent's scheduler every 5 s; a new program is admitted when its first request
arrives if it fits the GPU tier of the worker with the most room, else at the next step, where
it too may displace more idle programs. Its engine patch (typed offloading) labels the cache
with the tiers: busy blocks are evicted last on the GPU, and first on the host side.
"""

from maitred.runtime.admission import Cadence
from maitred.runtime.decisions import Assignment, Decision
from maitred.runtime.placement import signature, wants_gpu
from maitred.runtime.policies.base import assign_now, finish, healthy_free
from maitred.runtime.state import View
from maitred.runtime.tiering import plan_tiers


class Mori:
    name = "mori"
    warms = False  # proposes no warmups
    #: "the scheduler runs asynchronously with a default 5-second period" on ThunderAgent's
    #: scheduler, whose paused requests are let through after 1,800 s
    cadence = Cadence(period_s=5.0, hold_s=1800.0)

    def step(self, view: View) -> Decision:
        plan = plan_tiers(view, promote_waiting=True, displace=True)
        free = plan.gpu_free()
        homeless = [p for p in view.programs.values() if p.home_worker not in free and wants_gpu(p, view)]
        reserve = view.cfg.reserve_tokens
        assignments = []
        for p in sorted(homeless, key=lambda p: plan.iota(p)):  # least idle first, as on the spectrum
            worker = max(sorted(free), key=free.__getitem__, default=None)  # the most free room: spread the load
            if worker is None:
                break
            taken = plan.gpu_free()[worker] - free[worker]  # by this step's earlier assignments
            if p.weight(reserve) > free[worker] and plan.make_room(worker, p.weight(reserve) + taken, plan.iota(p)):
                free[worker] = plan.gpu_free()[worker] - taken
            if p.weight(reserve) <= free[worker]:
                assignments.append(Assignment(p.program_id, worker, "new" if p.home_worker is None else "failover", signature(p)))
                free[worker] -= p.weight(reserve)
        return finish(self.name, view, moves=plan.moves, assignments=assignments)

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        """A new program's first request goes in at once if it fits a GPU tier without moving
        anything: the worker with the most room (from the totals)."""
        p = view.programs[program_id]
        if p.home_worker is not None:
            return None
        free = healthy_free(view, tier_tokens=False)
        worker = max(sorted(free), key=free.__getitem__, default=None)
        if worker is None or p.weight(view.cfg.reserve_tokens) > free[worker]:
            return None
        return assign_now(self.name, p, worker)
