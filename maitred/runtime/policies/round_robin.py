"""Round robin: each new program goes to the next healthy worker; nothing is held or moved.
The engine's own LRU is all the memory management there is. The floor every policy must beat.

Like SGLang's router (``sgl-model-gateway``: a request is routed when it arrives), a new
program is placed by its first request (``admit_at_arrival``); the step only re-places programs
whose worker failed. The cursor is the state's count of assignments made, so the policy itself
remembers nothing between steps.
"""

from maitred.runtime.admission import Cadence
from maitred.runtime.decisions import Assignment, Decision
from maitred.runtime.placement import signature
from maitred.runtime.policies.base import assign_now, finish
from maitred.runtime.state import View


class RoundRobin:
    name = "round_robin"
    warms = False  # proposes no warmups
    #: the router has no period and no hold; a request that finds no healthy worker waits for one
    cadence = Cadence(period_s=1.0, hold_s=1800.0)

    def step(self, view: View) -> Decision:
        workers = sorted(w.worker_id for w in view.healthy_workers())
        assignments = []
        cursor = view.assignments_made
        for p in view.programs.values():
            if workers and (p.home_worker is None or p.home_worker not in workers):
                worker = workers[cursor % len(workers)]
                cursor += 1
                assignments.append(Assignment(p.program_id, worker, "new", signature(p)))
        return finish(self.name, view, assignments=assignments, admit_all=True)

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        workers = sorted(w.worker_id for w in view.healthy_workers())
        if not workers:
            return None
        p = view.programs[program_id]
        return assign_now(
            self.name, p, workers[view.assignments_made % len(workers)], "new" if p.home_worker is None else "failover"
        )
