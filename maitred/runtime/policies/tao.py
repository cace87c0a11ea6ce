"""TAO alone: interrupt and restart with joint, value-ranked placement (no host tier).

When a worker is over capacity, acting programs are interrupted lowest value first (value =
cache credit at home, readiness, context tokens, compared lexicographically) and join the
waiting pool; the pool — new, interrupted and returning programs that want the GPU — is then
placed all at once by the exact DP (BFD past its state budget). TAO publishes no cadence or
arrival rule: it plans every second, places every program in the step, and lets a held request
through after ThunderAgent's 1,800 s.
"""

from maitred.runtime.admission import Cadence
from maitred.runtime.decisions import Decision
from maitred.runtime.placement import candidates_for_placement, place
from maitred.runtime.policies.base import finish, pause_until_fits
from maitred.runtime.records import ProgramState
from maitred.runtime.signals import cache_credit
from maitred.runtime.state import View


class Tao:
    name = "tao"
    warms = False  # proposes no warmups
    cadence = Cadence(period_s=1.0, hold_s=1800.0)

    def admit_at_arrival(self, view: View, program_id: str) -> Decision | None:
        return None

    def step(self, view: View) -> Decision:
        half_life, versions = view.cfg.credit_half_life_s, dict(view.adapter_versions)

        def value(p: ProgramState, worker_id: str) -> tuple[int, int, int]:
            return (
                cache_credit(p, worker_id, view.now, half_life, versions),
                view.signals[p.program_id].readiness.r,
                p.context_tokens,
            )

        tiers, free, moves = pause_until_fits(view, value)
        candidates, reason = candidates_for_placement(view, tiers, free)
        placement = place(view, candidates, free, reason=reason)
        return finish(
            self.name,
            view,
            moves=moves,
            assignments=placement.assignments,
            dp_fallback=placement.fallback if candidates else None,
        )
