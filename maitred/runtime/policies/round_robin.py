"""Round robin: each new program goes to the next healthy worker; nothing is held or moved.
The engine's own LRU is all the memory management there is. The floor every policy must beat."""

from maitred.runtime.decisions import Assignment, Decision
from maitred.runtime.placement import signature
from maitred.runtime.policies.base import finish
from maitred.runtime.state import View


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._cursor = 0

    def step(self, view: View) -> Decision:
        workers = sorted(w.worker_id for w in view.healthy_workers())
        assignments = []
        for p in view.programs.values():
            if workers and (p.home_worker is None or p.home_worker not in workers):
                worker = workers[self._cursor % len(workers)]
                self._cursor += 1
                assignments.append(Assignment(p.program_id, worker, "new", signature(p)))
        return finish(self.name, view, assignments=assignments, admit_all=True)
