"""One scheduler step: signals → policy → decision applied to the state.

The simulator calls ``tick``, which plans on the live state and applies at once (one thread:
nothing changes in between). The gateway splits the step: ``plan`` runs the policy on a
``Snapshot`` in a worker thread while requests keep changing the live state, and ``apply``
re-checks the plan against the live state before it takes effect (TAO's plan re-check). A
policy that raises degrades to plain routing for that step (every program admitted where it
is; homeless ones round-robin) instead of losing requests.
"""

import logging
from dataclasses import replace

from maitred.runtime.decisions import Assignment, Decision, TierMove
from maitred.runtime.placement import applicable_prefix
from maitred.runtime.policies import Policy, RoundRobin, make_policy
from maitred.runtime.records import Tier
from maitred.runtime.state import RuntimeState, View

log = logging.getLogger("maitred.runtime")

#: Budget given to a worker on which the plan itself did not keep within free memory (a policy
#: without admission control, such as round robin): the re-check holds no plan to a budget it
#: never had.
UNBUDGETED = 1 << 62


class Scheduler:
    def __init__(self, state: RuntimeState, policy: Policy | str = "maitred") -> None:
        self.state = state
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._fallback = RoundRobin()
        self.steps = 0
        self.failures = 0
        self.dp_fallbacks = 0
        self.dp_steps = 0
        self.voided = 0  # planned assignments dropped by the re-check

    def tick(self, now: float) -> Decision:
        decision = self.plan(self.state.view(now))
        self.state.apply_decision(decision)
        return decision

    def plan(self, view: View) -> Decision:
        """The policy's decision on ``view``; the plain-routing one if the policy raises.
        Touches no live state, so it may run in another thread."""
        try:
            decision = self.policy.step(view)
        except Exception:
            self.failures += 1
            log.exception("maitred: policy %s failed; routing plainly this step", self.policy.name)
            decision = self._fallback.step(view)
        self.steps += 1
        if decision.dp_fallback is not None:
            self.dp_steps += 1
            self.dp_fallbacks += decision.dp_fallback
        return decision

    def apply(self, decision: Decision, planned: View, planned_free: dict[str, int] | None = None) -> Decision:
        """Apply the part of ``decision`` (made on the snapshot ``planned``) that still holds
        in the live state, and return that part.

        Tier moves stand while their program is still where the plan saw it. Assignments are
        cut at the first one whose program changed, left, or no longer fits its worker's live
        free memory (``applicable_prefix``). Warmups stand while their worker is healthy.
        ``planned_free``: ``free_after(decision, planned)``, when the caller computed it already
        (off the event loop: it walks every program)."""
        live = self.state.programs
        moves = tuple(m for m in decision.tier_moves if _still_valid(m, self.state))
        self.state.apply_decision(replace(decision, tier_moves=moves, assignments=()))
        now_view = View(
            now=planned.now,
            programs=live,
            workers=self.state.workers,
            signals={},
            adapter_versions=self.state.adapter_versions,
            handoffs=(),
            agent_prefix_tokens=self.state.agent_prefix_tokens,
            cfg=self.state.cfg,
            totals=self.state.totals(),
            tier_tokens=self.state.tier_tokens,
            assignments_made=self.state.assignments_made,
            prompts=self.state.prompts,
        )
        assignments: tuple[Assignment, ...] = ()
        if decision.assignments:
            free = planned_free if planned_free is not None else free_after(decision, planned)
            moved = {m.program_id: m.dst for m in moves if not m.lazy}
            assignments = applicable_prefix(decision.assignments, now_view, _budgets(decision, planned, free, self.state), moved)
        self.voided += len(decision.assignments) - len(assignments)
        self.state.apply_decision(replace(decision, tier_moves=(), assignments=assignments))
        healthy = {w for w, s in self.state.workers.items() if s.healthy}
        warmups = tuple(w for w in decision.warmups if w.worker in healthy and w.program_id in live)
        kept = {a.program_id for a in assignments}
        dropped = {a.program_id for a in decision.assignments} - kept
        admitted = frozenset(live.keys() & (decision.admitted - dropped))  # in C: a step may admit 10,000
        return replace(
            decision, tier_moves=moves, assignments=assignments, warmups=warmups, admitted=admitted, held=decision.held | dropped
        )


def _still_valid(move: TierMove, state: RuntimeState) -> bool:
    p = state.programs.get(move.program_id)
    return p is not None and p.home_worker == move.worker and (move.lazy or p.tier is move.src)


def free_after(decision: Decision, planned: View) -> dict[str, int]:
    """GPU-tier tokens free on each healthy worker of the snapshot once the decision's tier moves
    are made (before its assignments): the room the plan had to place programs in. The tier is
    the size the policy planned with (``Decision.tier_tokens``), else the worker's GPU."""
    reserve, gpu = planned.cfg.reserve_tokens, Tier.GPU  # an enum member read per program is slow on 3.11
    planned_free = {w.worker_id: decision.tier_tokens.get(w.worker_id, w.gpu_tokens) for w in planned.healthy_workers()}
    moved = {m.program_id: m.dst for m in decision.tier_moves if not m.lazy}  # a program's last move stands
    for p in planned.programs.values():
        if moved.get(p.program_id, p.tier) is gpu and p.home_worker in planned_free:
            planned_free[p.home_worker] -= p.weight(reserve)
    return planned_free


def _budgets(decision: Decision, planned: View, planned_free: dict[str, int], state: RuntimeState) -> dict[str, int]:
    """Live free GPU-tier tokens per healthy worker (the tier the policy planned with); unbounded
    where the plan did not budget (it assigned more than the room its own tier moves left on the
    snapshot)."""
    reserve = planned.cfg.reserve_tokens
    asked: dict[str, int] = {}
    for a in decision.assignments:
        if a.program_id in planned.programs:
            asked[a.worker] = asked.get(a.worker, 0) + planned.programs[a.program_id].weight(reserve)
    used = state.gpu_used()
    return {
        w: (UNBUDGETED if asked.get(w, 0) > planned_free.get(w, 0) else decision.tier_tokens.get(w, s.gpu_tokens) - used[w])
        for w, s in state.workers.items()
        if s.healthy
    }
