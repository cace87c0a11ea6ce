"""One scheduler step: signals → policy → decision applied to the state.

The live runtime calls ``tick`` on events and every period; the simulator calls the very same
thing with simulated time. A policy that raises degrades to plain routing for that step (every
program admitted where it is; homeless ones round-robin) instead of losing requests.
"""

import logging

from maitred.runtime.decisions import Decision
from maitred.runtime.policies import Policy, RoundRobin, make_policy
from maitred.runtime.state import RuntimeState

log = logging.getLogger("maitred.runtime")


class Scheduler:
    def __init__(self, state: RuntimeState, policy: Policy | str = "maitred") -> None:
        self.state = state
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._fallback = RoundRobin()
        self.steps = 0
        self.failures = 0
        self.dp_fallbacks = 0
        self.dp_steps = 0

    def tick(self, now: float) -> Decision:
        view = self.state.view(now)
        try:
            decision = self.policy.step(view)
        except Exception:
            self.failures += 1
            log.exception("maitred: policy %s failed; routing plainly this step", self.policy.name)
            decision = self._fallback.step(view)
        self.state.apply_decision(decision)
        self.steps += 1
        if decision.dp_fallback is not None:
            self.dp_steps += 1
            self.dp_fallbacks += decision.dp_fallback
        return decision
