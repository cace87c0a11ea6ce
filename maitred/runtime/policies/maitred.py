"""maitred: MORI's tiers, TAO's placement and readiness, LOCAL's pre-prefill, composed.

1. Tiering (MORI) per worker, by relative idleness, demoting in order of idleness per token
   (cheaper-to-restore programs first among the idle); dropped programs are left to step 2.
2. Placement (TAO) of the waiting pool — new, dropped, and returning programs that no longer
   fit at home — by the exact DP over (cache credit, readiness, tokens), BFD past its budget.
3. Pre-prefill (LOCAL + TAO): warm the consumers of handoffs and the programs about to return
   whose KV is not on their worker's GPU, on workers with no foreground queue.
"""

from maitred.runtime.decisions import Decision, Warmup
from maitred.runtime.placement import candidates_for_placement, place
from maitred.runtime.policies.base import finish
from maitred.runtime.preprefill import admit, propose
from maitred.runtime.state import View
from maitred.runtime.tiering import plan_tiers


class Maitred:
    name = "maitred"

    def __init__(self, *, preprefill: bool = True) -> None:
        self.preprefill = preprefill

    def step(self, view: View) -> Decision:
        tiers = plan_tiers(view, promote_waiting=False, per_token=True)
        free = tiers.gpu_free()
        candidates, reason = candidates_for_placement(view, tiers.tiers, free)
        placement = place(view, candidates, free, reason=reason)
        warmups: tuple[Warmup, ...] = ()
        if self.preprefill:
            left = dict(free)
            for a in placement.assignments:
                left[a.worker] -= view.programs[a.program_id].weight(view.cfg.reserve_tokens)
            warmups = admit(view, propose(view, placement.assignments), left)
        return finish(self.name, view, moves=tiers.moves, assignments=placement.assignments, warmups=warmups,
                      dp_fallback=placement.fallback if candidates else None)
