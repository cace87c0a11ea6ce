"""Cache-aware routing in the manner of SGLang's router (``--policy cache_aware``).

A program stays on the worker that holds its cache. A new program goes where the best prefix
match is — programs of the same agent share its system prompt — when that match covers at
least ``match_threshold`` of the agent's programs, else to the worker with the fewest tokens in
use. Like the router's ``balance_abs_threshold`` / ``balance_rel_threshold`` guard, when the
busiest worker holds more than ``balance_abs`` programs above the least busy one and more than
``balance_rel`` times as many, the match is ignored and the least loaded worker is taken (the
router counts requests; a program is this policy's unit). Nothing is held, demoted or prefetched.
The router routes each request as it arrives, so a new program is placed by its first request
(``admit_at_arrival``, the same choice from the state's per-worker totals).
"""

from collections import Counter

from maitred.runtime.admission import Cadence
from maitred.runtime.decisions import Assignment, Decision
from maitred.runtime.placement import signature
from maitred.runtime.policies.base import assign_now, finish
from maitred.runtime.state import View


class CacheAware:
    name = "cache_aware"
    warms = False  # proposes no warmups
    cadence = Cadence(period_s=1.0, hold_s=1800.0)

    def __init__(self, match_threshold: float = 0.5, balance_abs: int = 8, balance_rel: float = 1.5) -> None:
        self.match_threshold = match_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel

    def step(self, view: View) -> Decision:
        healthy = {w.worker_id for w in view.healthy_workers()}
        if not healthy:
            return finish(self.name, view, admit_all=True)
        load = {w: 0 for w in healthy}
        count = {w: 0 for w in healthy}
        agents: dict[str, Counter[str]] = {}
        for p in view.programs.values():
            if p.home_worker in healthy:
                load[p.home_worker] += p.context_tokens
                count[p.home_worker] += 1
                agents.setdefault(p.agent or "", Counter())[p.home_worker] += 1
        assignments = []
        for p in view.programs.values():
            if p.home_worker in healthy:
                continue
            worker = self._choose(agents.get(p.agent or "", Counter()), load, count)
            load[worker] += p.context_tokens
            count[worker] += 1
            agents.setdefault(p.agent or "", Counter())[worker] += 1
            assignments.append(Assignment(p.program_id, worker, "new", signature(p)))
        return finish(self.name, view, assignments=assignments, admit_all=True)

    def _choose(self, peers: Counter[str], load: dict[str, int], count: dict[str, int]) -> str:
        """The worker with the agent's prefix when the match is good and the load balanced, else
        the one with the fewest tokens in use."""
        best = min(peers, key=lambda w: (-peers[w], w), default=None)  # ties by worker id, as in every driver
        hits = peers[best] if best is not None else 0
        share = hits / max(sum(peers.values()), 1)
        busiest, idlest = max(count.values()), min(count.values())
        balanced = busiest - idlest <= self.balance_abs or busiest <= self.balance_rel * idlest
        if best is not None and share >= self.match_threshold and balanced:
            return best
        return min(sorted(load), key=load.__getitem__)

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        healthy = sorted(w.worker_id for w in view.healthy_workers())
        if not healthy:
            return None
        p = view.programs[program_id]
        totals = view.totals
        load = {w: totals.worker(w).homed_context for w in healthy}
        count = {w: totals.worker(w).homed_programs for w in healthy}
        agent = p.agent or ""
        peers = Counter({w: totals.agent_homes[(agent, w)] for w in healthy if totals.agent_homes[(agent, w)] > 0})
        return assign_now(self.name, p, self._choose(peers, load, count), "new" if p.home_worker is None else "failover")
