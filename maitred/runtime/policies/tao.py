"""TAO alone: interrupt and restart with joint, value-ranked placement (no host tier).

When a worker is over capacity, acting programs are interrupted lowest value first (value =
cache credit at home, readiness, context tokens, compared lexicographically) and join the
waiting pool; the pool — new, interrupted and returning programs that want the GPU — is then
placed all at once by the exact DP (BFD past its state budget).
"""

from maitred.runtime.decisions import Decision, TierMove
from maitred.runtime.model import Phase, Tier
from maitred.runtime.placement import candidates_for_placement, place
from maitred.runtime.policies.base import finish
from maitred.runtime.signals import cache_credit
from maitred.runtime.state import View


class Tao:
    name = "tao"

    def step(self, view: View) -> Decision:
        cfg, reserve = view.cfg, view.cfg.reserve_tokens
        versions = dict(view.adapter_versions)
        tiers = {pid: p.tier for pid, p in view.programs.items()}
        free = {w.worker_id: w.gpu_tokens for w in view.healthy_workers()}
        for p in view.programs.values():
            if tiers[p.program_id] is Tier.GPU and p.home_worker in free:
                free[p.home_worker] -= p.weight(reserve)
        moves: list[TierMove] = []
        for worker_id in free:
            acting = [
                p for p in view.programs.values()
                if p.home_worker == worker_id and tiers[p.program_id] is Tier.GPU and p.phase is not Phase.REASONING
            ]
            acting.sort(key=lambda p: (cache_credit(p, worker_id, view.now, cfg.credit_half_life_s, versions),
                                       view.signals[p.program_id].readiness.r, p.context_tokens))
            for p in acting:
                if free[worker_id] >= 0:
                    break
                moves.append(TierMove(p.program_id, worker_id, Tier.GPU, Tier.WAITING))
                tiers[p.program_id] = Tier.WAITING
                free[worker_id] += p.weight(reserve)
        candidates, reason = candidates_for_placement(view, tiers, free)
        placement = place(view, candidates, free, reason=reason)
        return finish(self.name, view, moves=moves, assignments=placement.assignments,
                      dp_fallback=placement.fallback if candidates else None)
